"""The simulated cluster: sender and receiver ranks as processes over real ZMQ sockets.

Every rule it follows comes from :mod:`kvspec`; nothing here restates one.
"""
