"""What bench/'s report scripts share: reading a run's log or output file."""


def read(path):
    """The file's text, or "" when it is missing or unreadable (a run that
    has not got that far: its row is printed empty rather than failing)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""
