"""Starting worker processes without importing the user's ``__main__``.

multiprocessing's ``spawn`` and ``forkserver`` re-run the agent's main module in every
worker (so scripts need an ``if __name__ == "__main__":`` guard, and code piped through
stdin or typed in a notebook cannot start workers at all); ``fork`` copies a process that
may have threads. Instead, each agent process starts one *zygote*: a fresh interpreter
(``python -c``) that imports numpy, gymnasium and aiovec once, then forks a worker per
request. The worker receives its channel socket by ``SCM_RIGHTS``; everything else it
needs (the target function, the env factories) arrives pickled, with the agent's
``sys.path``, working directory and custom Gymnasium registrations.

Lifetime guarantees:

- The zygote lives as long as the agent's control socket: when the agent exits or is
  killed (SIGKILL included), the zygote sees end of file, SIGKILLs every worker it
  forked and exits; workers also carry ``PR_SET_PDEATHSIG`` tied to the zygote. So
  workers die within moments of the agent, whatever their env is doing.
- The agent follows each worker through a pidfd (Linux >= 5.3), which becomes readable
  when the worker exits and signals the exact process even after its pid is reused.
  Exit codes come from the zygote, the worker's parent.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from aiovec._interrupts import no_interrupt
from aiovec._transport import by_value
from aiovec._transport.channel import out_of_descriptors
from aiovec._worker.registrations import agent_registrations, install

_HEADER = struct.Struct("<I")


def available() -> bool:
    """Whether workers can be started by a zygote here (Linux with pidfd support)."""
    return hasattr(os, "pidfd_open") and hasattr(socket, "send_fds") and sys.platform == "linux"


# --- framing shared by both ends ------------------------------------------------------------


def _send_frame(sock: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    frame = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else 0
    sock.sendall(memoryview(frame)[sent:])


def _receive_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame and the descriptors that came with it; EOFError when the peer is gone."""
    data = bytearray()
    fds: list[int] = []
    needed = _HEADER.size
    while len(data) < needed:
        # MSG_CMSG_CLOEXEC: never inherited by a program this process (or a worker forked
        # from it) starts.
        chunk, new_fds, flags, _ = socket.recv_fds(
            sock, max(needed - len(data), 1 << 16), 4, socket.MSG_CMSG_CLOEXEC
        )
        if flags & socket.MSG_CTRUNC:  # the kernel dropped descriptors we had no room for
            for fd in new_fds + fds:
                os.close(fd)
            raise out_of_descriptors()
        if not chunk:
            for fd in new_fds + fds:
                os.close(fd)
            raise EOFError("the other end of the zygote's socket closed")
        data += chunk
        fds += new_fds
        if len(data) >= _HEADER.size:
            needed = _HEADER.size + _HEADER.unpack_from(data)[0]
    assert len(data) == needed, "requests and answers alternate: never more than one frame"
    return bytes(data[_HEADER.size :]), fds


# --- the agent's side -------------------------------------------------------------------------


def launch_command(fd: int) -> str:
    """The ``python -c`` program of a zygote talking to its agent on descriptor ``fd``.
    Ctrl-C is the agent's (a terminal sends it to the whole process group): ignored
    before anything is imported, so that it never interrupts the zygote's imports."""
    return (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"import aiovec._worker.zygote as z; z.serve({fd})"
    )


class Zygote:
    """The agent's handle on its zygote. One per agent process (see :func:`shared`);
    safe to use from several threads (requests are serialized)."""

    def __init__(self) -> None:
        parent_end, child_end = socket.socketpair()
        command = launch_command(child_end.fileno())
        self._lock = threading.Lock()
        self._sock = parent_end
        self._pid_of_owner = os.getpid()
        # A process group of its own: a terminal's Ctrl-C (sent to the agent's group)
        # never reaches it, not even while its interpreter starts, before any of its
        # code runs. Its workers lead groups of their own anyway (see _fork).
        own_group: dict[str, Any] = (
            {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        )
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", command],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                **own_group,
            )
        finally:
            child_end.close()
        self._broken = False
        self._sock.settimeout(START_TIMEOUT)
        try:
            hello, _ = _receive_frame(self._sock)
        except (EOFError, OSError) as exc:
            self._process.kill()
            self._process.wait()
            raise RuntimeError(
                f"aiovec could not start its worker launcher ({sys.executable} -c 'import "
                f"aiovec._worker.zygote'): {exc}. The interpreter must be able to import this "
                "aiovec (see its output above); or pass context='spawn' or 'fork'"
            ) from None
        self._sock.settimeout(None)
        self._registry: dict[str, Any] = pickle.loads(hello)

    @property
    def alive(self) -> bool:
        return (
            not self._broken and self._process.poll() is None and self._pid_of_owner == os.getpid()
        )

    def _request(
        self, message: Any, fds: Sequence[int] = (), timeout: float | None = None
    ) -> tuple[Any, list[int]]:
        """Send ``message`` and return the answer; ``timeout``: seconds to wait for it
        (default :data:`START_TIMEOUT`)."""
        if self._broken:
            raise OSError("the zygote's requests and answers fell out of step")
        # The lock is taken inside the guard: the deferred Ctrl-C is raised once it is
        # released, so that a handler of the user's may use the zygote (close a vector env).
        received_fds: list[int] = []
        try:
            with no_interrupt(), self._lock:
                try:
                    self._sock.settimeout(START_TIMEOUT if timeout is None else timeout)
                    _send_frame(self._sock, pickle.dumps(message), fds)
                    answer, received_fds = _receive_frame(self._sock)
                    self._sock.settimeout(None)
                except BaseException:
                    # An answer may still be on its way: never read it as the next one.
                    # The zygote is kept (its workers live on); a new one serves new workers.
                    self._broken = True
                    raise
        except BaseException:
            # The deferred Ctrl-C, raised once the answer is in: its descriptors (a new
            # worker's pidfd) go with it. The worker ends when its agent's socket closes.
            for descriptor in received_fds:
                os.close(descriptor)
            raise
        kind, value = pickle.loads(answer)
        if kind == "error":
            raise RuntimeError(f"the aiovec zygote could not start a worker: {value}")
        return value, received_fds

    def spawn(
        self,
        target: Any,
        sock: socket.socket,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> ZygoteProcess:
        """Fork ``target(sock, *args, **kwargs)`` from the zygote; its process handle."""
        # Unpickled in the worker only (after sys.path is set), never in the zygote.
        blob = by_value.dumps((target, args, kwargs or {}, agent_registrations(self._registry)))
        # multiprocessing's authkey too: proxies of a Manager (a shared Value, Barrier)
        # captured by a factory must connect to it from the worker.
        authkey = bytes(multiprocessing.current_process().authkey)
        # sys.argv too: envs may read the agent's flags, as in AsyncVectorEnv's workers
        # (an embedded interpreter may have none: the worker then keeps its own)
        argv = getattr(sys, "argv", None)
        argv = list(argv) if isinstance(argv, (list, tuple)) else None
        state = (argv, list(sys.path), os.getcwd(), dict(os.environ), authkey, blob)
        pid, (pidfd,) = self._request(("spawn", state), [sock.fileno()])
        return ZygoteProcess(self, pid, pidfd)

    def exitcode(self, pid: int) -> int | None:
        """``pid``'s exit code once it has exited (negative: killed by that signal)."""
        try:
            return cast("int | None", self._request(("status", pid), timeout=STATUS_TIMEOUT)[0])
        except (OSError, EOFError):  # the zygote is gone: so is the code
            return None

    def close(self) -> None:
        """Stop the zygote (its workers are killed with it)."""
        self._sock.close()
        if self._pid_of_owner == os.getpid():
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


_shared: Zygote | None = None
_retired: list[Zygote] = []  # replaced by a new zygote, not yet exited
# Re-entrant: a Ctrl-C handler of the user's may build a vector env while this thread
# starts the zygote.
_shared_lock = threading.RLock()


#: Seconds the zygote may take to start, or to answer a request.
START_TIMEOUT = 60.0
#: Seconds it may take to say how a worker exited (it answers at once unless it is
#: stuck: closing must not wait on it).
STATUS_TIMEOUT = 5.0


def shared() -> Zygote:
    """This process's zygote, started on first use (and again if it died)."""
    global _shared
    with _shared_lock:
        # Zygotes replaced earlier are reaped once they exit (not left zombies); one out
        # of step lives on while workers it started do.
        _retired[:] = [old for old in _retired if old._process.poll() is None]
        if _shared is None or not _shared.alive:
            if _shared is None:
                atexit.register(_close_shared)
            elif _shared._process.poll() is None:
                _retired.append(_shared)
            _shared = Zygote()
        return _shared


def _close_shared() -> None:
    if _shared is not None and _shared._pid_of_owner == os.getpid():
        _shared.close()


def _forget_after_fork() -> None:
    """A forked child must not keep the parent's zygote alive, nor talk to it."""
    global _shared, _shared_lock
    _shared_lock = threading.RLock()
    if _shared is not None:
        try:
            _shared._sock.close()
        except OSError:
            pass
        _shared = None


os.register_at_fork(after_in_child=_forget_after_fork)


class ZygoteProcess:
    """A worker forked by the zygote, with the parts of ``multiprocessing.Process`` that
    the process backend uses (``pid``, ``sentinel``, ``exitcode``, ``join``, ``kill``,
    ``terminate``, ``close``)."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int) -> None:
        self._zygote = zygote
        self.pid = pid
        # Opened by the zygote before it could reap the process (which may exit at
        # once): readable once the process has exited.
        self.sentinel = pidfd
        self._exitcode: int | None = None
        self._group_killed = False

    def _exited(self, timeout: float | None = 0) -> bool:
        if self.sentinel < 0:
            return True
        ready, _, _ = select.select([self.sentinel], [], [], timeout)
        return bool(ready)

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None and self._exited():
            self._exitcode = self._zygote.exitcode(self.pid)
            if self._exitcode is None and not self._group_killed and self.zygote_died:
                # The zygote kills a dead worker's group (what its envs started, see
                # _kill_group); it is gone, so this does.
                self._group_killed = True
                _kill_group(self.pid)
        return self._exitcode

    def is_alive(self) -> bool:
        return not self._exited()

    @property
    def zygote_died(self) -> bool:
        """Whether the zygote that forked this worker has died (taking it along)."""
        return self._zygote._process.poll() is not None

    def join(self, timeout: float | None = None) -> None:
        self._exited(timeout)

    def _signal(self, signum: int) -> None:
        if self.sentinel >= 0 and not self._exited():
            try:
                signal.pidfd_send_signal(self.sentinel, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Release the pidfd (the exit code is fetched first, if the worker is gone)."""
        if self.sentinel >= 0:
            self.exitcode  # noqa: B018 -- fetch it while the zygote still knows it
            self.forget()

    def forget(self) -> None:
        """Release the pidfd without asking the zygote anything (a forked copy)."""
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1

    def __del__(self) -> None:
        # A handle dropped unclosed (a Ctrl-C before its owner kept it) keeps no pidfd.
        try:
            self.forget()
        except Exception:  # at interpreter exit, after os is torn down: the OS closes it
            pass


# --- the zygote's side ------------------------------------------------------------------------


def serve(fd: int) -> None:
    """The zygote's main loop: fork workers on request until the agent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the agent's (launch_command)
    agent = socket.socket(fileno=fd)
    import gymnasium

    import aiovec._worker.main  # noqa: F401 -- preload: numpy, gymnasium, aiovec

    # SIGCHLD only wakes the loop (through this pipe); reaping happens in the loop.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int | None] = {}  # pid -> exit code once reaped

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children[pid] = os.waitstatus_to_exitcode(status)
            if children[pid] != 0:  # killed or crashed: its envs' close() never ran
                _kill_group(pid)

    registry = {}
    for env_id, spec in gymnasium.registry.items():
        try:
            registry[env_id] = pickle.loads(pickle.dumps(spec))
        except Exception:  # the agent then always sends its own
            continue
    try:
        _send_frame(agent, pickle.dumps(registry))
    except OSError:  # the agent went away while this started (a Ctrl-C): nobody to serve
        return
    watched: list[socket.socket | int] = [agent, wake_read]
    try:
        while True:
            ready, _, _ = select.select(watched, [], [])
            if wake_read in ready:
                os.read(wake_read, 4096)
                reap()
            if agent not in ready:
                continue
            try:
                request, fds = _receive_frame(agent)
            except (EOFError, OSError):
                return
            answer_fds: list[int] = []
            try:
                kind, value = pickle.loads(request)
                if kind == "spawn":
                    pid = _fork(value, fds, agent, (wake_read, wake_write))
                    children[pid] = None  # a reused pid: forget the old code
                    answer_fds.append(os.pidfd_open(pid))  # before any reaping
                    answer: tuple[str, Any] = ("ok", pid)
                else:  # "status"
                    reap()
                    answer = ("ok", children.get(value))
            except Exception as exc:
                answer = ("error", f"{type(exc).__name__}: {exc}")
            finally:
                for descriptor in fds:
                    os.close(descriptor)
            try:
                _send_frame(agent, pickle.dumps(answer), answer_fds)
            except OSError:  # the agent is gone, or dropped this zygote: nobody to answer
                return
            finally:
                for descriptor in answer_fds:
                    os.close(descriptor)
    finally:
        # The agent is gone (or stopped us): no worker may outlive it, nor what its
        # envs started.
        for pid, code in children.items():
            if code is None:
                _kill_group(pid)
        deadline = time.monotonic() + 5
        while any(code is None for code in children.values()) and time.monotonic() < deadline:
            reap()
            time.sleep(0.01)


def _kill_group(pid: int) -> None:
    """SIGKILL worker ``pid`` and every process in its group: what its envs started (a
    simulator) and did not move to a group of its own. Nothing if none is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _fork(spec: Any, fds: list[int], agent: socket.socket, wake_fds: tuple[int, int]) -> int:
    (worker_fd,) = fds
    pid = os.fork()
    if pid:
        try:  # as the child does: whichever runs first, no kill finds it in ours
            os.setpgid(pid, pid)
        except OSError:  # it has exited already
            pass
        return pid
    # The child: back to a plain process, then run the target; never return to the loop.
    status = 1
    try:
        # A process group of its own, which the processes its envs start join: when it
        # is killed or crashes (so that no env's close() stops them), the zygote kills
        # them with it (_kill_group). Ctrl-C is the agent's: a terminal's no longer
        # reaches the worker (which ignores it anyway) nor the envs' processes.
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        agent.close()
        for descriptor in wake_fds:
            os.close(descriptor)
        argv, sys_path, cwd, environ, authkey, blob = spec
        if argv is not None:
            sys.argv[:] = argv
        sys.path[:] = sys_path
        os.environ.clear()
        os.environ.update(environ)
        multiprocessing.current_process().authkey = authkey
        try:
            os.chdir(cwd)
        except OSError:
            pass
        target, args, kwargs, specs = by_value.loads(blob)
        install(specs)
        target(socket.socket(fileno=worker_fd), *args, **kwargs)
        status = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
