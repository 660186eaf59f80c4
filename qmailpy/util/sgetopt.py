"""djb's getopt: clustered flags (-oem, -FCronDaemon), '--' ends options, so does '-' or a word."""


class GetoptError(Exception):
    """An unknown option or a missing argument; .option names the letter."""

    def __init__(self, option, message):
        super().__init__(message)
        self.option = option


def sgetopt(argv, optstring, optional=""):
    """([(letter, value-or-None)], remaining args).

    optstring: letters, each followed by ':' when it takes an argument (attached
    or the next word). Letters in `optional` take only an attached argument.
    """
    takes = {}
    i = 0
    while i < len(optstring):
        letter = optstring[i]
        has_arg = optstring[i + 1:i + 2] == ":"
        takes[letter] = has_arg
        i += 2 if has_arg else 1
    for letter in optional:
        takes.setdefault(letter, False)
    opts = []
    idx = 0
    while idx < len(argv):
        word = argv[idx]
        if word == "--":
            idx += 1
            break
        if not word.startswith("-") or word == "-":
            break
        pos = 1
        idx += 1
        while pos < len(word):
            letter = word[pos]
            pos += 1
            if letter not in takes:
                raise GetoptError(letter, "illegal option -- %s" % letter)
            if letter in optional:
                opts.append((letter, word[pos:] or None))
                break
            if not takes[letter]:
                opts.append((letter, None))
                continue
            if pos < len(word):
                opts.append((letter, word[pos:]))
            elif idx < len(argv):
                opts.append((letter, argv[idx]))
                idx += 1
            else:
                raise GetoptError(letter, "option requires an argument -- %s" % letter)
            break
    return opts, argv[idx:]
