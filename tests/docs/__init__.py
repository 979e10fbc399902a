"""The docs run as written: every code block of docs/ a user would copy is run or parsed
here (test_docs_blocks.py), or included from a file a test runs."""
