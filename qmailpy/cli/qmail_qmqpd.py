"""qmail-qmqpd [-c limit] [-s perclient] [-r reserved] [-t timeout] [-n uses] [-i seconds] [--tcp HOST:PORT]:
the queue server (qmail-qmqpd(8)).

Listens on QMAILHOME/run/qmqp.sock (or on the sockets systemd passes), and with
--tcp also on HOST:PORT for the clients control/qmqpclients allows. Started as
root it binds first, then runs as qmailq (qmailpy.queue.qmqpdsetup); this module only
reads the arguments.
"""
import sys

from qmailpy.queue.qmqpdsetup import PROG


def _parse(argv):
    import argparse
    parser = argparse.ArgumentParser(prog=PROG, description="the QMQP queue server")
    parser.add_argument("-c", dest="limit", type=int, default=None, metavar="LIMIT",
                        help="connections handled at once (default 40)")
    parser.add_argument("-t", dest="timeout", type=float, default=None, metavar="SECONDS",
                        help="time a connection may take (default 1200)")
    parser.add_argument("-s", dest="per_client", type=int, default=None, metavar="PERCLIENT",
                        help="requests one uid or TCP address may have at once (default: half of -c)")
    parser.add_argument("-r", dest="reserved", type=int, default=None, metavar="RESERVED",
                        help="connections kept for qmaild and qmails (default: a quarter of -c)")
    parser.add_argument("-n", dest="max_use", type=int, default=None, metavar="USES",
                        help="requests one queueing worker serves (default 100)")
    parser.add_argument("-i", dest="max_idle", type=float, default=None, metavar="SECONDS",
                        help="idle time after which a worker exits (default 100)")
    parser.add_argument("--tcp", metavar="HOST:PORT", help="also answer QMQP on TCP")
    args = parser.parse_args(argv)
    for name, option in (("limit", "-c"), ("max_use", "-n"), ("per_client", "-s")):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error("%s needs a positive number" % option)
    from qmailpy.queue.server import DEFAULT_LIMIT
    if args.reserved is not None and not 0 <= args.reserved < (args.limit or DEFAULT_LIMIT):
        parser.error("-r needs a number from 0 to one less than -c")
    if args.max_idle is not None and args.max_idle <= 0:
        parser.error("-i needs a positive number of seconds")
    if args.timeout is not None and args.timeout <= 0:
        parser.error("-t needs a positive number of seconds")
    if args.tcp is not None:
        host, sep, port = args.tcp.rpartition(":")
        if not sep or not host or not port.isdigit():
            parser.error("--tcp needs HOST:PORT")
        args.tcp = (host.strip("[]"), int(port))
    return args


def main(argv=None):
    args = _parse(sys.argv[1:] if argv is None else argv)
    from qmailpy.queue import qmqpdsetup
    options = {k: v for k, v in (("limit", args.limit), ("timeout", args.timeout),
                                 ("max_use", args.max_use), ("max_idle", args.max_idle),
                                 ("per_client", args.per_client), ("reserved", args.reserved))
               if v is not None}
    return qmqpdsetup.run(args.tcp, options)


if __name__ == "__main__":
    sys.exit(main())
