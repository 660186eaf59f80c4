"""No function in qmailpy/ over 100 lines or above cyclomatic complexity 30 (issue 28).

Complexity is McCabe's as radon counts it (radon cc): 1, plus 1 for each if, elif,
conditional expression, for, while (and each loop's else), except clause and try's
else, assert, comprehension `for` and `if`, match case other than a catch-all, and
each further operand of `and`/`or`. A nested function or class is measured on its
own, not as part of the function around it. Counted here with ast so the test needs
nothing beyond Python; radon's figures are the same for every function in qmailpy/.
"""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "qmailpy"
MAX_LINES = 100
MAX_COMPLEXITY = 30
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _decision_points(node):
    if isinstance(node, ast.Try):
        return len(node.handlers) + bool(node.orelse)
    if isinstance(node, ast.BoolOp):
        return len(node.values) - 1
    if isinstance(node, (ast.If, ast.IfExp, ast.Assert)):
        return 1
    if isinstance(node, ast.Match):
        catch_all = any(isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None
                        for case in node.cases)
        return max(0, len(node.cases) - catch_all)
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return 1 + bool(node.orelse)
    if isinstance(node, ast.comprehension):
        return 1 + len(node.ifs)
    return 0


def complexity(function):
    """The cyclomatic complexity of one function's body, nested functions and classes left out."""
    total = 1
    pending = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, FUNCTIONS + (ast.ClassDef,)):
            continue
        total += _decision_points(node)
        pending.extend(ast.iter_child_nodes(node))
    return total


def functions():
    """(where, lines, complexity) of every function and method in qmailpy/, nested ones too."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, FUNCTIONS):
                where = "%s:%d %s" % (path.relative_to(PACKAGE.parent), node.lineno, node.name)
                yield where, node.end_lineno - node.lineno + 1, complexity(node)


def test_the_walk_finds_the_package_s_functions():
    assert sum(1 for _ in functions()) > 1000


def test_complexity_counts_as_radon_does():
    source = '''
def f(a, b):
    if a and b or a:
        for x in a:
            pass
        else:
            pass
    try:
        pass
    except KeyError:
        pass
    except OSError:
        pass
    else:
        pass
    y = [x for x in a if x if b]
    z = 1 if a else 2
    while b:
        assert a
    def inner():
        if a:
            pass
    match a:
        case 1:
            pass
        case _:
            pass
'''
    function = ast.parse(source).body[0]
    # 1 + if 1 + and/or 2 + for and else 2 + two handlers and else 3 + comprehension
    # and two ifs 3 + IfExp 1 + while 1 + assert 1 + match 1 (the inner function's if
    # is its own): what `radon cc` gives f
    assert complexity(function) == 16


def test_no_function_is_over_100_lines():
    long = ["%s: %d lines" % (where, lines) for where, lines, _ in functions() if lines > MAX_LINES]
    assert not long, "functions over %d lines:\n%s" % (MAX_LINES, "\n".join(long))


def test_no_function_is_above_complexity_30():
    tangled = ["%s: complexity %d" % (where, points) for where, _, points in functions()
               if points > MAX_COMPLEXITY]
    assert not tangled, "functions above complexity %d:\n%s" % (MAX_COMPLEXITY,
                                                                "\n".join(tangled))


if __name__ == "__main__":
    pytest.main([__file__])
