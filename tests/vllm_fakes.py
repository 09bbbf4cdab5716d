"""A stand-in ``vllm`` executable for the tests of ``ragsuite serve``.

It takes ``vllm serve MODEL --port PORT ...``, records what it was started with in ``LOGS/PORT.json``
(``args``, ``key``: its ``$VLLM_API_KEY``, ``gpus``: its ``$CUDA_VISIBLE_DEVICES``) and serves
``/v1/models`` (``--served-model-name``, else MODEL) on 127.0.0.1, whatever ``--host`` says, until SIGINT
or SIGTERM, on which it exits 0.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

_SCRIPT = textwrap.dedent(
    """\
    #!{python}
    import json, os, signal, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    if {fail}:
        print("fake vllm: CUDA not available", file=sys.stderr)
        sys.exit(3)
    assert args[0] == "serve", args
    port = int(args[args.index("--port") + 1])
    if port == {fail_port}:
        sys.exit(5)
    name = args[args.index("--served-model-name") + 1] if "--served-model-name" in args else args[1]
    env = os.environ
    record = {{"args": args, "key": env.get("VLLM_API_KEY"), "gpus": env.get("CUDA_VISIBLE_DEVICES")}}
    with open(os.path.join({logs!r}, f"{{port}}.json"), "w") as f:
        json.dump(record, f)
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            body = json.dumps({{"data": [{{"id": name}}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def write_fake_vllm(folder: Path, *, fail: bool = False, fail_port: int = 0) -> tuple[Path, Path]:
    """Write the stand-in as ``folder/vllm``; returns it and the folder of its records (``PORT.json``).

    Args:
        folder: Where the script and its ``logs`` folder go.
        fail: Exit 3 at once with a CUDA error, as vLLM on a machine without a GPU does.
        fail_port: Exit 5 at once when asked to serve on this port (one failing replica).
    """
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    script = folder / "vllm"
    script.write_text(_SCRIPT.format(python=sys.executable, fail=fail, fail_port=fail_port, logs=str(logs)))
    script.chmod(0o755)
    return script, logs
