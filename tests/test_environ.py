"""qmailpy.util.environ.replace: a worker's environment set per job, seen by the programs it runs."""
import os
import subprocess

import pytest

from qmailpy.util.environ import replace


@pytest.fixture
def saved_environ():
    saved = dict(os.environb)
    yield
    replace(os.environb, saved)


def environment_of_a_child():
    out = subprocess.run(["env", "-0"], capture_output=True, check=True).stdout
    return dict(line.split(b"=", 1) for line in out.split(b"\0") if line)


def assert_child_sees(wanted):
    """Every wanted variable, and of the QPY_ ones no other. (Only those: a C library in the
    test process, readline, may have set more with setenv, which os.environ never shows.)"""
    child = environment_of_a_child()
    assert {k: child.get(k) for k in wanted} == wanted
    assert {k for k in child if k.startswith(b"QPY_")} == {k for k in wanted if k.startswith(b"QPY_")}


@pytest.mark.parametrize("known", [False, True])
def test_the_environment_becomes_exactly_the_wanted_one(saved_environ, known):
    first = {**os.environb, b"QPY_KEEP": b"same", b"QPY_CHANGE": b"before", b"QPY_GONE": b"x"}
    held = replace(os.environb, first)
    assert_child_sees(first)
    second = {**first, b"QPY_CHANGE": b"after", b"QPY_NEW": b""}
    del second[b"QPY_GONE"]
    held = replace(os.environb, second, held if known else None)
    assert_child_sees(second)
    assert held == second and held is not second      # a copy: the caller may change second


def test_str_names_for_os_environ(saved_environ):
    held = replace(os.environ, dict(os.environ, QPY_A="1"))
    wanted = {k: v for k, v in os.environ.items() if k != "QPY_A"}
    replace(os.environ, dict(wanted, QPY_B="2"), held)
    child = environment_of_a_child()
    assert b"QPY_A" not in child and child[b"QPY_B"] == b"2"
