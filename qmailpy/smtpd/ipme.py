"""This host's IPv4 interface addresses, as qmail's ipme.c lists them (plus 0.0.0.0)."""
import array
import fcntl
import socket
import struct

SIOCGIFCONF = 0x8912
_IFREQ_SIZE = 40            # struct ifreq on LP64 Linux: 16-byte name + 24-byte union


def local_ipv4_addresses():
    """A set of dotted quads; OSError when the interface list cannot be read."""
    found = {"0.0.0.0"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        size = 64 * _IFREQ_SIZE
        while True:
            buf = array.array("B", bytes(size))
            addr, _ = buf.buffer_info()
            ifconf = struct.pack("iL", size, addr)
            length = struct.unpack("iL", fcntl.ioctl(s.fileno(), SIOCGIFCONF, ifconf))[0]
            if length < size:
                break
            size *= 2
        data = buf.tobytes()[:length]
    for off in range(0, length, _IFREQ_SIZE):
        sockaddr = data[off + 16:off + 32]
        if struct.unpack_from("H", sockaddr)[0] == socket.AF_INET:
            found.add(socket.inet_ntoa(sockaddr[4:8]))
    return found
