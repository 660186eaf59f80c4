"""rspamd from Debian as a real milter for the tests: the packaged configuration with a
local configuration directory of the test's own ($LOCAL_CONFDIR): every worker on a free
127.0.0.1 port, the proxy worker in milter mode scanning by itself (self_scan), headers
added to every message (milter_headers: X-Spamd-Result, X-Rspamd-Server, ...), no
hyperscan compilation and a short public-suffix list (it starts in seconds, not minutes),
its database, pid and log in the test's directory.

Rspamd(directory) starts it (as _rspamd when root) and waits for its proxy port to
answer; .port is the milter's port; .stop() ends it. Unavailable (skip) when rspamd is not
installed or does not start.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time

START_TIMEOUT = 180      # seconds: it loads every rule of the packaged configuration


TLDS = ("com", "net", "org", "example", "test", "invalid", "localhost")


class Unavailable(Exception):
    pass


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Rspamd:
    def __init__(self, directory):
        self.rspamd = shutil.which("rspamd")
        if self.rspamd is None:
            raise Unavailable("rspamd is not installed")
        self.dir = directory
        self.port, normal, controller = _free_ports(3)
        conf = os.path.join(directory, "local")
        for sub in ("local.d", "override.d", "db", "run"):
            os.makedirs(os.path.join(conf if sub.endswith(".d") else directory, sub), exist_ok=True)
        files = {
            "override.d/worker-proxy.inc":
                'bind_socket = "127.0.0.1:%d";\nmilter = yes;\ntimeout = 120s;\ncount = 1;\n'
                'upstream "local" {\n  default = yes;\n  self_scan = yes;\n}\n'
                'reject_message = "Spam message rejected";\n' % self.port,
            "override.d/worker-normal.inc": 'bind_socket = "127.0.0.1:%d";\ncount = 1;\n' % normal,
            "override.d/worker-controller.inc": 'bind_socket = "127.0.0.1:%d";\ncount = 1;\n' % controller,
            # a short public-suffix list: compiling the packaged one (9628 suffixes) takes a minute
            "local.d/options.inc": 'disable_hyperscan = true;\nurl_tld = "%s/tld.dat";\n'
                                   'dns { timeout = 1s; retransmits = 1; }\n' % directory,
            "override.d/logging.inc": 'type = "file";\nfilename = "%s/rspamd.log";\nlevel = "info";\n'
                                      % directory,
            "local.d/milter_headers.conf": 'use = ["x-spamd-result", "x-rspamd-server", '
                                           '"x-rspamd-queue-id", "x-spam-level"];\n'
                                           'skip_local = false;\nskip_authenticated = false;\n',
            "local.d/redis.conf": "",
        }
        with open(os.path.join(directory, "tld.dat"), "w") as f:
            f.write("".join(tld + "\n" for tld in TLDS))
        for name, text in files.items():
            with open(os.path.join(conf, name), "w") as f:
                f.write(text)
        argv = [self.rspamd, "-f", "-c", "/etc/rspamd/rspamd.conf",
                "--var", "LOCAL_CONFDIR=" + conf, "--var", "DBDIR=" + directory + "/db",
                "--var", "RUNDIR=" + directory + "/run", "--var", "LOGDIR=" + directory]
        if os.geteuid() == 0:
            account = pwd.getpwnam("_rspamd")
            for root, dirs, names in os.walk(directory):
                for name in dirs + names + ["."]:
                    os.chown(os.path.join(root, name), account.pw_uid, account.pw_gid)
            os.chmod(directory, 0o755)
            argv += ["-u", "_rspamd", "-g", "_rspamd"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise Unavailable("rspamd did not start: %s" % self.log()[-2000:])
            time.sleep(0.2)    # polling a port that has no event to wait on

    def log(self):
        try:
            with open(os.path.join(self.dir, "rspamd.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
