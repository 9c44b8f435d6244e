"""Transport: the payload a sender ships, chunked delivery, and the wire format
[PAYLOAD, CHUNK, WIRE]."""
