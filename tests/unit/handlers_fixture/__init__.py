"""Sample handler modules for tests/unit/test_handler.py, loaded by spec as `rmqkit consume`
does."""
