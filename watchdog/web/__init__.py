"""The read-only web view (`agent-watchdog web`): server-rendered pages, SVG charts, JSON under /api/.

Standard library only (wsgiref, threaded): it reads, it never writes, and it needs no stack of its own.
"""
