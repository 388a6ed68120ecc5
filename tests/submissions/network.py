"""Hostile: opens a connection beyond loopback (192.0.2.1 is TEST-NET-1: documentation only, never routed)."""
import socket

socket.create_connection(("192.0.2.1", 80), timeout=10).sendall(b"GET / HTTP/1.0\r\n\r\n")
