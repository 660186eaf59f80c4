"""Where pip put the qmailpy distribution's data files (setup.cfg [options.data_files]).

Under site, they are under sys.prefix (a virtualenv's directory). HOME/bin's
launchers start Python with -IS, so sys.prefix is the base interpreter's
(/usr), and a system pip on Debian puts them under /usr/local while sys.prefix
is /usr: the distribution's own file list (RECORD) says where they went, found
through the metadata next to the package on sys.path. Only qmailctl needs
this; importlib.metadata is imported only when asked.
"""
import os

DISTRIBUTION = "qmailpy"


def data_file(rel):
    """The installed path of data file rel (e.g. share/qmailpy/queue-layout/layout.conf),
    or None when the distribution is not installed or has no such file."""
    import importlib.metadata
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.as_posix().endswith("/" + rel) or entry.as_posix() == rel:
            path = os.path.normpath(os.path.abspath(str(entry.locate())))
            if os.path.exists(path):
                return path
    return None
