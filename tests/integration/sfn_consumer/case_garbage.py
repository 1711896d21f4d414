import sys

sys.stdout.write("this is not JSON")
