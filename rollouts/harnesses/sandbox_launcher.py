"""Started inside the sandbox before a harness (copied there by :mod:`.bridge`; any Python 3 runs it,
standard library only): it relays a loopback port of the sandbox's own network namespace to the
model proxy's unix socket, starts the harness's command with the address in its environment, and
ends it when the episode is stopped (a file the host creates) or when it ends by itself.

    python3 sandbox_launcher.py SOCKET STOPFILE COMMAND

The sandbox has no network: the socket, bound in read-only, is its only way out, and it leads only
to the proxy. Nothing here is trusted: the harness (or what the model made of the sandbox) may kill
this process; the sandbox's own timeout and cleanup are the backstop.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

STOPPED_EXIT = 125  # the episode was stopped from outside (budget spent, endpoint failed, deadline)


def pump(source, target):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, target):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay(listener, path):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def main(argv):
    path, stop_file, command = argv[1], argv[2], argv[3]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    base_url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    threading.Thread(target=relay, args=(listener, path), daemon=True).start()
    env = dict(os.environ)
    env.update({"OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url, "PATCHGYM_BASE_URL": base_url})
    child = subprocess.Popen(["bash", "-c", command], env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    while child.poll() is None:
        if os.path.exists(stop_file):
            with open(stop_file) as fh:
                reason = fh.read().strip()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(child.pid, sig)
                except OSError:
                    pass
                time.sleep(1)
            sys.stdout.write(f"\n[patchgym: the harness was stopped: {reason}]\n")
            sys.stdout.flush()
            return STOPPED_EXIT
        time.sleep(0.1)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
