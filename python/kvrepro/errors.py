"""The package's one error type for bad input, in its own module so that
`python -m kvrepro.cli` (which loads cli.py a second time as __main__) and
the modules it calls raise and catch the same class."""


class InputError(Exception):
    """Bad input: the message names the file and field (exit 2)."""
