"""How ``clusterpush --master`` tells a restricted user gate from a plain ssh login.

A developer's key may be a plain login as the master's account (then clusterpush ships its
own code and runs it there: :mod:`cluster.triggers.remotepush`) or restricted to the user
gate (``usergate.py``, docs/operating.md "The user gate": it runs the master's own code and
ships nothing).  :func:`hello` asks ``clusterpush-gate hello``, which only the gate answers
(a plain login has no such command); every later step is then sent as
``clusterpush-gate <step> ...`` words, with no ``--home`` (the gate's holds).
"""

from __future__ import annotations

import json

import paramiko

from cluster.runtime.ssh import exec_bytes

#: The first word of every request to the gate.
GATE_WORD = "clusterpush-gate"
#: The gate protocol this client speaks.
PROTOCOL = 1
#: What starts the line that carries a step's outcome (the master's pushremote.MARKER).
MARKER = "clusterpush-remote: "
#: The hello's time limit [s].
HELLO_TIMEOUT = 60.0


def hello(client: paramiko.SSHClient) -> dict[str, object] | None:
    """The gate's answer (``{"gate": version, "user": NAME, "admin": bool}``), or None on a
    plain login."""
    status, out, _err = exec_bytes(client, f"{GATE_WORD} hello", HELLO_TIMEOUT)
    if status != 0:
        return None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except ValueError:
                return None
            if isinstance(value, dict) and value.get("gate") == PROTOCOL:
                return value
    return None
