"""qmail-qmqpc against real hubs (qmail-qmqpd --tcp on 127.0.0.1): control/qmqpservers
tried in order, qmail-qmqpc.c's exit codes, nothing lost when no hub answers."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from net_support import dead_port
from qmqpd_harness import QmqpServer
from queue_view import queued

MESSAGE = b"Subject: via qmqp\n\nhello hub\n"


def run_qmqpc(env, message=MESSAGE, envelope=b"Fa@mini.example\0Tu@test.example\0\0"):
    env_r, env_w = os.pipe()
    os.write(env_w, envelope)
    os.close(env_w)
    try:
        done = subprocess.run(["qmail-qmqpc"], input=message, stdout=env_r, stderr=subprocess.PIPE,
                              env=env, timeout=60)
    finally:
        os.close(env_r)
    return done.returncode


@pytest.fixture
def client(tmp_path):
    """A home with only control/ (a null client's needs) and the environment to run in it."""
    os.makedirs(tmp_path / "mini" / "control")
    env = dict(os.environ, QMAILHOME=str(tmp_path / "mini"),
               PATH=os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    env.pop("QMAILQUEUE", None)

    def servers(*lines):
        (tmp_path / "mini" / "control" / "qmqpservers").write_text("".join(l + "\n" for l in lines))
    env_servers = servers
    return env, env_servers


@pytest.fixture
def hub(qmail_home):
    qmail_home.control("qmqpclients", "127.0.0.1:allow\n")
    with QmqpServer(qmail_home, "--tcp", "127.0.0.1:0") as server:
        server.home = qmail_home
        yield server


def test_the_first_hub_down_the_next_one_queues(client, hub):
    env, servers = client
    host, port = hub.tcp
    servers("# hubs", "mail.example.com", "127.0.0.1:%d" % dead_port(), "%s:%d" % (host, port))
    assert run_qmqpc(env) == 0
    (msg,) = queued(hub.home)
    assert (msg.sender, msg.recipients) == (b"a@mini.example", [b"u@test.example"])
    assert msg.mess.endswith(MESSAGE)


def test_every_hub_down_is_a_temporary_failure(client, hub):
    env, servers = client
    servers("127.0.0.1:%d" % dead_port(), "127.0.0.1:%d" % dead_port())
    assert run_qmqpc(env) == 73            # "connection to mail server rejected": temporary
    servers("not-an-address")
    assert run_qmqpc(env) == 55
    os.unlink(os.path.join(env["QMAILHOME"], "control", "qmqpservers"))
    assert run_qmqpc(env) == 55
    assert queued(hub.home) == []


def test_a_hub_that_fails_mid_request_is_not_followed_by_the_next(client, hub):
    env, servers = client
    rude = socket.create_server(("127.0.0.1", 0))

    def hang_up():
        conn, _ = rude.accept()
        conn.recv(10)
        conn.close()
    t = threading.Thread(target=hang_up)
    t.start()
    servers("127.0.0.1:%d" % rude.getsockname()[1], "%s:%d" % hub.tcp)
    assert run_qmqpc(env) == 74            # the hub may have queued it: no second copy
    t.join()
    rude.close()
    assert queued(hub.home) == []


@pytest.mark.slow
def test_the_hubs_permanent_refusal_and_bad_envelopes(client, hub):
    env, servers = client
    servers("%s:%d" % hub.tcp)
    hub.home.control("databytes", "10\n")
    assert run_qmqpc(env) == 31
    assert run_qmqpc(env, envelope=b"Xa\0\0") == 91
    assert run_qmqpc(env, envelope=b"Fa@b\0Tu@c\0") == 54
    assert queued(hub.home) == []


@pytest.mark.slow
def test_a_hub_that_never_answers_the_connection_times_out_in_10_seconds(client, hub):
    env, servers = client
    black_hole = socket.create_server(("127.0.0.1", 0), backlog=0)
    waiting = socket.create_connection(black_hole.getsockname())    # fills the accept queue
    try:
        servers("127.0.0.1:%d" % dead_port(), "127.0.0.1:%d" % black_hole.getsockname()[1])
        started = time.monotonic()
        assert run_qmqpc(env) == 72        # the last hub tried timed out
        assert 9 <= time.monotonic() - started < 30
    finally:
        waiting.close()
        black_hole.close()
    assert queued(hub.home) == []
