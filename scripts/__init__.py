"""Repository scripts; a package so that the tests can import ``scripts.rabbitmq_nodes``."""
