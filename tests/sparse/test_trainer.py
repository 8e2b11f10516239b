"""``cs_run.Trainer(sparsity=...)``, the vendor Trainer's argument: an algorithm object, a callable returning
one, or a params ``sparsity`` section. Reference: the same algorithm on the same model in a plain custom loop
(``model.apply(sparsity)``, ``optimizer.apply(sparsity)``, forward, backward, step), which the Trainer's CPU
run must equal bit for bit (the same float ops in the same order), and its CSX run too (fx tier)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import cs_run
from cs_run.backend import _reset_for_tests
from cs_run.errors import ParamsError
from cs_run.frontends.trainer import Trainer
from cs_run.sparse import Group, RigL, Static, configure

SECTION = {"algorithm": "rigl", "sparsity": 0.5, "update": {"freq": 3}, "init_method": "topk"}
STEPS = 9


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(4 * STEPS, 6, generator=g), torch.randint(0, 3, (4 * STEPS,), generator=g)),
                      batch_size=4, shuffle=False, drop_last=True)


def reference() -> dict:
    model = Net()
    sparsity = configure(SECTION)
    model.apply(sparsity)
    optimizer = cs_run.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.apply(sparsity)
    for batch in loader():
        model(batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.clone() for k, v in model.state_dict().items()}


def fit(tmp_path, device: str, sparsity) -> tuple[dict, Trainer]:
    with _reset_for_tests():
        model = Net()
        trainer = Trainer(device=device, model_dir=str(tmp_path / device), model=model,
                          optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          loop={"num_steps": STEPS}, checkpoint={"steps": STEPS}, logging={"log_steps": 3},
                          sparsity=sparsity(model) if callable(sparsity) else sparsity)
        trainer.fit(loader())
        return {k: v.clone() for k, v in model.state_dict().items()}, trainer


FORMS = {
    "section": SECTION,
    "object": lambda model: configure(SECTION),
    "callable": lambda model: (lambda: configure(SECTION)),
}


@pytest.mark.parametrize("form", FORMS)
def test_trainer_sparsity_equals_the_custom_loop_with_the_same_algorithm(tmp_path, form):
    expected = reference()
    got, trainer = fit(tmp_path, "CPU", FORMS[form])
    assert {k for k in got if k.endswith("_mask")} == {"net.0.weight_mask", "net.2.weight_mask"}
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    assert int(trainer.runner.sparsity[0].step) == STEPS
    assert [int(got[k].sum()) for k in ("net.0.weight_mask", "net.2.weight_mask")] == [24, 12]  # 0.5 of 48, 24
    saved = cs_run.load(str(tmp_path / "CPU" / f"checkpoint_{STEPS}.mdl"))
    assert int(saved["sparsity"][0]["step"]) == STEPS and "net.0.weight_mask" in saved["model"]


def test_trainer_sparsity_on_csx_is_bit_identical_to_cpu(tmp_path):
    cpu, _ = fit(tmp_path, "CPU", FORMS["callable"])
    csx, trainer = fit(tmp_path, "CSX", FORMS["callable"])
    assert type(trainer.runner).__name__ == "PyTorchCSRunner"
    for key, value in cpu.items():
        assert torch.equal(csx[key], value), key


def test_an_algorithm_object_serves_one_model(tmp_path):
    algorithm = RigL(sparsity=0.5)
    with _reset_for_tests():
        trainer = Trainer(device="CPU", model_dir=str(tmp_path / "m"), model=Net, optimizer={"optimizer_type": "SGD",
                          "learning_rate": 0.1}, loop={"num_steps": 2}, sparsity=Group({"*.weight": algorithm}))
        trainer.fit(loader())
        with pytest.raises(ParamsError, match=r"Trainer: sparsity: this algorithm already sparsified another model .* "
                                              r"pass a callable that returns a new algorithm, or a sparsity section"):
            trainer.fit(loader())


@pytest.mark.parametrize("sparsity,regex", [
    ("dense", r"Trainer: sparsity must be a cstorch.sparse.SparsityAlgorithm, a callable returning one, or a "
              r"sparsity section \(a level, a mapping or a list\), got str"),
    ({"sparsity": 1.5}, r"^Trainer: sparsity.sparsity: must be >= 0 and < 1, got 1.5$"),
    ([{"sparsity": 0.5, "init_method": "chess"}], r"^Trainer: sparsity\[0\].init_method: 'chess' is not one of"),
    (lambda: 3, r"^Trainer: sparsity: expected a cstorch.sparse.SparsityAlgorithm \(or a callable returning one\), "
                r"got int$"),
    (lambda: Group({"nothing.*": Static(sparsity=0.5)}),
     r"^Trainer: sparsity: the algorithm sparsified no parameter of the model \(names such as net.0.weight\)$"),
    (lambda: Static(sparsity=0.5, init_method="checkerboard"), None),  # the good one
])
def test_a_bad_trainer_sparsity_is_one_error(tmp_path, sparsity, regex):
    with _reset_for_tests():
        def make():
            return Trainer(device="CPU", model_dir=str(tmp_path / "m"), model=Net(), optimizer={
                "optimizer_type": "SGD", "learning_rate": 0.1}, loop={"num_steps": 1}, sparsity=sparsity)

        if regex is None:
            make().fit(loader())
            return
        with pytest.raises(ParamsError, match=regex):
            make().fit(loader())
        assert not (tmp_path / "m").exists()  # refused before model_dir was written
