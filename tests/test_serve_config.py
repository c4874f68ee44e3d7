"""``cis serve``'s configuration (docs/runtime.md, *Configuration*): one declaration of every option, a
flag over a CIS_* variable over the --config file over the default, one line for a bad key or value;
and ``cis --version``. No processes here: live effect is in test_ops_live.py."""

from __future__ import annotations

import dataclasses

import pytest

from cis import __version__
from cis.cli.commands import serve_config as options
from cis.cli.commands.serve import _node_options
from cis.cli.main import build_parser
from cis.core.errors import CisError
from cis.runtime.node_config import STAGE_THREADS, NodeConfig


def resolved(*argv: str, env: dict | None = None):
    args = build_parser().parse_args(["serve", "bundle", *argv])
    settings = options.resolve(args, env or {})
    return args, settings


def test_a_node_options_default_is_nodeconfigs_written_once():
    args, settings = resolved("--node", "edge0")
    defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
    given = options.node_config(args)
    assert given == {k: defaults[k] for k in given}  # every node option at NodeConfig's default
    assert set(given) == {"max_batch", "max_wait", "forward_timeout", "heartbeat", "max_message_bytes", "rcv_hwm",
                          "rcv_buf", "nonfinite", "adapt", "spin"}  # queue_limit: the spec's unless set  # fmt: skip
    assert args.threads == STAGE_THREADS and args.cap is True and args.metrics_port is None
    assert settings == options.logs.LogSettings("info", "text")
    assert _node_options(args) == []  # nothing to pass on that a node would not take by itself


def test_a_flag_beats_the_variable_which_beats_the_file_which_beats_the_default(tmp_path):
    conf = tmp_path / "serve.toml"
    conf.write_text('node = "edge0"\nmax_batch = 8\nqueue_limit = 100\nadapt = true\nthreshold = inf\n'
                    'log_format = "json"\n')  # fmt: skip
    args, settings = resolved("--config", str(conf), "--max-batch", "4", env={"CIS_MAX_BATCH": "16"})
    assert (args.node, args.max_batch, args.queue_limit, args.adapt, args.threshold) == ("edge0", 4, 100, True,
                                                                                          float("inf"))  # fmt: skip
    assert settings.format == "json"
    args, _ = resolved("--config", str(conf), env={"CIS_MAX_BATCH": "16", "CIS_ADAPT": "off"})
    assert args.max_batch == 16 and args.adapt is False
    args, settings = resolved("--config", str(conf), "--no-adapt", env={"CIS_LOG_FORMAT": "text"})
    assert args.max_batch == 8 and args.adapt is False and settings.format == "text"
    args, _ = resolved("--node", "edge0", env={"CIS_CONFIG": str(conf), "CIS_NODE": "cloud", "CIS_MAX_BATCH": " "})
    assert args.node == "edge0" and args.max_batch == 8  # CIS_CONFIG names the file; an empty variable is unset


def test_all_passes_resolved_values_on_and_its_nodes_read_no_variables(tmp_path):
    args, _ = resolved("--all", env={"CIS_CAP": "false", "CIS_SPIN": "1", "CIS_MAX_WAIT": "0.01", "CIS_NODE": "x"})
    assert args.node is None  # --all serves every node
    argv = _node_options(args)
    assert "--no-cap" in argv and "--spin" in argv and argv[argv.index("--max-wait") + 1] == "0.01"
    env = options.child_env({"CIS_SPIN": "1", "CIS_LOG_DIR": "/x", "CIS_CONFIG": "f", "CIS_LOG_LEVEL": "debug",
                             "PATH": "/bin"})  # fmt: skip
    assert env == {"CIS_LOG_LEVEL": "debug", "PATH": "/bin"}


def test_paths_in_the_file_are_relative_to_the_file(tmp_path):
    (tmp_path / "conf").mkdir()
    conf = tmp_path / "conf" / "serve.toml"
    conf.write_text('node = "edge0"\nspec = "../spec.toml"\ntrust = "/abs/key.pem"\n')
    args, _ = resolved("--config", str(conf))
    assert args.spec == str(tmp_path / "conf" / "../spec.toml") and args.trust == "/abs/key.pem"


@pytest.mark.parametrize(
    "text, message",
    [
        ("max-batch = 8", "unknown key 'max-batch' (did you mean max_batch?); expected serve's options: node, spec"),
        ("max_batch = 'x'", "max_batch is 'x'; expected an integer"),
        ("max_batch = true", "max_batch is True; expected an integer"),
        ("adapt = 1", "adapt is 1; expected true or false"),
        ("nonfinite = 'drop'", "nonfinite is 'drop'; expected one of refuse, flag"),
        ("log_level = 'loud'", "log_level is 'loud'; expected one of debug, info, warning, error, critical"),
        ("max_batch = ", "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, run_cli, text, message):
    conf = tmp_path / "serve.toml"
    conf.write_text(text + "\n")
    with pytest.raises(CisError) as err:
        resolved("--node", "a", "--config", str(conf))
    assert str(err.value).startswith(f"{conf}: ") and message in str(err.value)
    res = run_cli("serve", tmp_path, "--node", "a", "--config", conf)
    assert res.code == 2 and res.err.strip().splitlines() == [f"cis serve: error: {err.value}"]


def test_bad_variables_and_a_missing_file_are_one_line_too(tmp_path):
    with pytest.raises(CisError, match="CIS_MAX_WAIT is 'soon'; expected a number"):
        resolved("--node", "a", env={"CIS_MAX_WAIT": "soon"})
    with pytest.raises(CisError, match="CIS_SPIN is 'maybe'; expected true or false"):
        resolved("--node", "a", env={"CIS_SPIN": "maybe"})
    with pytest.raises(CisError, match="cannot read the config file"):
        resolved("--node", "a", "--config", str(tmp_path / "none.toml"))
    with pytest.raises(CisError, match="--node and --all"):
        resolved("--node", "a", "--all")
    with pytest.raises(CisError, match="no node to serve"):
        resolved()


def test_version(run_cli, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"cis {__version__}"
    assert run_cli("rates", "--log-level", "loud").code == 2  # the log options after the command too
