import sys

sys.stdout.write('{"ratio": NaN}')
