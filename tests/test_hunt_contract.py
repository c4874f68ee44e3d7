"""The model contract's hunt (docs/your-model.md): a diverging run or a model whose output is NaN fails in one line
(exit 2) instead of finishing with a plausible accuracy; integer or NaN logits are refused before training;
``with_exits`` names a module given twice; a partial ``--weights`` load warns (``--log-level warning`` shows it)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from cis.core.errors import CisError  # noqa: E402
from cis.training.local import Client, ExitSGDTrainer, NonFiniteLoss  # noqa: E402
from cis.training.models.contract import EarlyExitNet, check_chain  # noqa: E402

MODEL = '''
from torch import nn


def make(num_classes, input_shape):
    d = 1
    for s in input_shape:
        d *= s
    return [(nn.Flatten(), nn.Linear(d, num_classes)), (nn.Linear(d, 8), nn.Linear(8, num_classes)),
            (nn.Linear(8, 8), nn.Linear(8, num_classes))]
'''


class NanInTraining(nn.Module):
    """A head whose output is NaN in training mode only (the pre-training check runs in eval mode)."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, k)

    def forward(self, f):
        out = self.fc(f)
        return out * float("nan") if self.training else out


def tiny(head: nn.Module | None = None) -> EarlyExitNet:
    torch.manual_seed(0)
    return EarlyExitNet([(nn.Linear(4, 4), head or nn.Linear(4, 3)), (nn.Linear(4, 4), nn.Linear(4, 3))])


def trainer(lr: float, steps: int = 3) -> ExitSGDTrainer:
    return ExitSGDTrainer(lr=lr, momentum=0.9, weight_decay=0.0, batch_size=8, steps=steps, total_rounds=1)


def client() -> Client:
    gen = torch.Generator().manual_seed(0)
    return Client("n0", 0, 2, torch.randn(16, 4, generator=gen), torch.arange(16) % 3)


def test_a_diverging_local_step_is_one_line_naming_the_lr_and_the_fix():
    model, c, t = tiny(), client(), trainer(lr=1e12)
    t.setup(model, [c])
    with pytest.raises(NonFiniteLoss, match=r"training loss is (nan|inf) at lr 1e\+12; .*try a lower --lr") as err:
        t.train(model, c, 2, 1, torch.Generator().manual_seed(1))
    assert isinstance(err.value, CisError) and "\n" not in str(err.value)
    ok = trainer(lr=0.01)  # a sane lr trains as before
    ok.setup(model := tiny(), [c])
    assert np.isfinite(ok.train(model, c, 2, 1, torch.Generator().manual_seed(1))["loss"])


def test_a_model_whose_training_output_is_nan_stops_at_its_first_step():
    model, c, t = tiny(NanInTraining(4, 3)), client(), trainer(lr=0.01)
    check_chain(model, torch.zeros(2, 4), 3)  # eval mode: finite
    t.setup(model, [c])
    with pytest.raises(NonFiniteLoss, match="the training loss is nan at lr 0.01; .*the model's own output"):
        t.train(model, c, 1, 1, torch.Generator().manual_seed(1))
    with pytest.raises(NonFiniteLoss, match="summed over the round's 3 steps"):  # a trainer of its own steps
        t.round_stats(float("nan"), c, 0.01)


def test_a_diverging_run_exits_2_with_one_line_and_keeps_nothing(tmp_path, run_cli, one_torch_thread):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(90, 1, 4, 4)).astype(np.float32), y=np.arange(90) % 3)
    (tmp_path / "m.py").write_text(MODEL)
    out = tmp_path / "run"
    r = run_cli("train", "--data", tmp_path / "d.npz", "--model", f"{tmp_path / 'm.py'}:make", "--lr", "1e8",
                "--rounds", "1", "--local-steps", "3", "--no-progress", "--out", out)
    assert r.code == 2, r.err
    last = r.err.strip().splitlines()[-1]
    assert "training stopped in round 1, node " in last and "NonFiniteLoss: the training loss is" in last, r.err
    assert "try a lower --lr" in last and "Traceback" not in r.err and not out.exists()
    assert "exit accuracy" not in r.out


def _pairs(head: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    return [(nn.Linear(4, 4), head), (nn.Linear(4, 4), nn.Linear(4, 3))]


class Cast(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fc, self.fn = nn.Linear(4, 3), fn

    def forward(self, f):
        return self.fn(self.fc(f))


@pytest.mark.parametrize("fn, message", [
    (lambda t: t.long(), r"stage 1's head returned \(2, 3\) int64; expected floating-point logits \(2, 3\)"),
    (lambda t: t * float("nan"), r"stage 1's head returned NaN logits \(check sample 0 of 2\); expected finite"),
    (lambda t: t + float("inf"), "stage 1's head returned inf logits"),
])
def test_integer_or_nan_logits_are_refused_before_training(fn, message):
    with pytest.raises(CisError, match=message):
        check_chain(EarlyExitNet(_pairs(Cast(fn))), torch.zeros(2, 4), 3, "model m.py:make")
    masked = Cast(lambda t: torch.cat([t[:, :2], torch.full_like(t[:, 2:], float("-inf"))], 1))
    check_chain(EarlyExitNet(_pairs(masked)), torch.zeros(2, 4), 3)  # a class masked out (-inf) is fine
    check_chain(EarlyExitNet(_pairs(Cast(lambda t: t.double()))), torch.zeros(2, 4), 3)  # any float dtype


def test_a_body_output_that_is_nan_is_said_with_the_head():
    class NanBody(nn.Module):
        def forward(self, x):
            return x * float("nan")

    with pytest.raises(CisError, match="its body's output holds NaN or inf already"):
        check_chain(EarlyExitNet([(NanBody(), nn.Linear(4, 3))]), torch.zeros(2, 4), 3)


def test_with_exits_names_a_module_given_twice():
    from cis.training.models.backbone import split_after

    net = nn.Sequential(OrderedDict(layer1=nn.Linear(4, 4), layer2=nn.Linear(4, 4), fc=nn.Linear(4, 2)))
    with pytest.raises(CisError, match=r"\(layer1 named twice; its top-level modules: layer1, layer2, fc\)"):
        split_after(net, ["layer1", "layer1", "layer2"])
    with pytest.raises(CisError, match=r"\(no names;"):
        split_after(net, [])
    with pytest.raises(CisError, match=r"\(first unknown: layer9;"):
        split_after(net, ["layer1", "layer9", "layer9"])


def test_a_partial_weights_load_is_a_warning(tmp_path, caplog):
    from cis.training.weights_file import load_weights

    model = tiny()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("stage_list.1.head.")}
    state["fc.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "w.pt")
    cli = logging.getLogger("cis.cli.commands.train")  # what `cis train` hands it: its logger's info
    with caplog.at_level(logging.WARNING):
        load_weights(tiny(), tmp_path / "w.pt", cli.info)
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == [logging.WARNING] * 3, said
    assert "loaded 6 of the model's 8" in said[0][1] and "missing 2" in said[1][1] and "unexpected 1" in said[2][1]
    caplog.clear()
    lines: list[str] = []
    with caplog.at_level(logging.WARNING):
        load_weights(tiny(), tmp_path / "w.pt", lines.append)  # a caller collecting the lines gets them too
    assert len(lines) == 3 and len(caplog.records) == 3
    torch.save(model.state_dict(), tmp_path / "all.pt")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        load_weights(tiny(), tmp_path / "all.pt", cli.info)  # a whole load is news, not a warning
    assert [r.levelno for r in caplog.records] == [logging.INFO]
