"""tcprules' source format: which client addresses are allowed and what variables they get.

A line is ADDRESS:allow or ADDRESS:deny, optionally followed by ,VAR="value"
settings (any character may stand for the quotes); lines starting with # are
comments. As tcpserver does, a client's rule is the one for its exact address,
else for the longest prefix of it ending in a dot, else for the empty address;
of several lines with the same address the first counts. A range like 10.1-3.
stands for 10.1., 10.2. and 10.3. Addresses with = or @ (host names, ident)
never match: qmailpy's listeners look neither up. No rule for a client: allowed,
nothing set.
"""


def parse_rules(text):
    """{address: (allow, variables)} from rules text; ValueError names a bad line."""
    table = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip(" \t\r")
        if not line or line[0] == "#":
            continue
        try:
            address, rule = _parse_rule(line)
            if "=" in address or "@" in address:
                continue
            keys = _expand_range(address)
        except ValueError:
            raise ValueError("line %d: %s" % (number, line)) from None
        for key in keys:
            table.setdefault(key, rule)
    return table


def lookup(table, ip):
    """(allow, ((name, value), ...)) for a client address in a parse_rules() table."""
    rule = table.get(ip)
    end = len(ip)
    while rule is None:
        end = ip.rfind(".", 0, end)
        if end < 0:
            return table.get("", (True, ()))
        rule = table.get(ip[:end + 1])
    return rule


def _parse_rule(line):
    if "\0" in line:
        raise ValueError(line)
    # The address may itself hold colons (IPv6): the separator is the colon before the verb.
    colon = line.find(":")
    while colon >= 0 and not line.startswith(("allow", "deny"), colon + 1):
        colon = line.find(":", colon + 1)
    if colon < 0:
        raise ValueError(line)
    allow = line.startswith("allow", colon + 1)
    rest = line[colon + (6 if allow else 5):]
    variables = []
    while rest:
        equals = rest.find("=")
        if rest[0] != "," or equals < 2 or equals + 1 == len(rest):
            raise ValueError(line)
        close = rest.find(rest[equals + 1], equals + 2)
        if close < 0:
            raise ValueError(line)
        variables.append((rest[1:equals], rest[equals + 2:close]))
        rest = rest[close + 1:]
    return line[:colon], (allow, tuple(variables))


def _expand_range(address):
    """tcprules' ranges: 1.2.3.37-43 and 10.1-3. name each number in between."""
    dash = address.find("-")
    if dash < 0:
        return [address]
    left = address.rfind(".", 0, dash) + 1
    right = address.find(".", dash)
    if right < 0:
        right = len(address)
    low, high = address[left:dash], address[dash + 1:right]
    if not (low.isdigit() and high.isdigit() and low.isascii() and high.isascii()):
        raise ValueError(address)
    head, tail = address[:left], address[right:]
    return [head + str(n) + tail for n in range(int(low), min(int(high), 255) + 1)]
