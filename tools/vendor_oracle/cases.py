"""The cases the oracle records and the tests replay (plain data plus their one builder), importable from both venvs.

Nothing here imports torch or either package: the oracle (run with the vendor's venv) and the
tests (run with cs-run's) both read these tables, so a case means the same thing on both sides.
"""

from __future__ import annotations

STEPS = 50  # optimizer steps per case
SCHED_STEPS = 1000  # scheduler steps per case
RESUME_AT = 30  # the vendor AdamW checkpoint is written after this many steps ...
RESUME_STEPS = 20  # ... and continued for this many

# (case id, vendor class name, constructor kwargs). "defaults" cases pass only what the class requires.
OPTIMIZER_CASES: list[tuple[str, str, dict]] = [
    ("SGD-defaults", "SGD", {"lr": 0.05}),
    ("SGD-momentum-dampening-wd", "SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01}),
    ("SGD-nesterov-wd", "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD-momentum-maximize", "SGD", {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    ("Adam-defaults", "Adam", {}),
    ("Adam-wd", "Adam", {"lr": 0.01, "weight_decay": 0.1}),
    ("Adam-amsgrad-betas-eps", "Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-8, "amsgrad": True}),
    ("AdamW-defaults", "AdamW", {}),
    ("AdamW-wd", "AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("AdamW-wd-no-bias-correction", "AdamW", {"lr": 0.01, "weight_decay": 0.1, "correct_bias": False}),
    ("AdamW-amsgrad", "AdamW", {"lr": 0.01, "weight_decay": 0.01, "amsgrad": True}),
    ("Adamax-defaults", "Adamax", {}),
    ("Adamax-wd-maximize", "Adamax", {"lr": 0.01, "weight_decay": 0.1, "maximize": True}),
    ("Adadelta-defaults", "Adadelta", {}),
    ("Adadelta-rho-wd-maximize", "Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad-defaults", "Adagrad", {}),
    ("Adagrad-all", "Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1,
                                "initial_accumulator_value": 0.1, "maximize": True}),
    ("ASGD-defaults", "ASGD", {}),
    ("ASGD-t0-lambd-wd", "ASGD", {"lr": 0.05, "t0": 10, "lambd": 1e-3, "weight_decay": 0.1, "maximize": True}),
    ("NAdam-defaults", "NAdam", {}),
    ("NAdam-wd", "NAdam", {"lr": 0.01, "weight_decay": 0.1, "momentum_decay": 8e-3}),
    ("RAdam-defaults", "RAdam", {}),
    ("RAdam-wd", "RAdam", {"lr": 0.01, "weight_decay": 0.1, "betas": (0.8, 0.9)}),
    ("RMSprop-defaults", "RMSprop", {}),
    ("RMSprop-momentum-centered", "RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True}),
    ("RMSprop-alpha-wd-centered", "RMSprop", {"lr": 0.01, "alpha": 0.9, "weight_decay": 0.1, "centered": True}),
    ("Rprop-defaults", "Rprop", {}),
    ("Rprop-etas-step-sizes", "Rprop", {"lr": 0.01, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2)}),
    ("Lamb-defaults", "Lamb", {}),
    ("Lamb-wd", "Lamb", {"lr": 0.01, "weight_decay": 0.1}),
    ("Lamb-adam-wd", "Lamb", {"lr": 0.01, "weight_decay": 0.1, "adam": True}),
    ("Lion-defaults", "Lion", {}),
    ("Lion-betas-wd", "Lion", {"lr": 1e-3, "betas": (0.95, 0.98), "weight_decay": 0.5}),
    ("Adafactor-defaults", "Adafactor", {"lr": 0.01}),
    ("Adafactor-wd-no-scale", "Adafactor", {"lr": 0.01, "weight_decay": 0.01, "scale_parameter": False,
                                            "eps": (1e-30, 1e-2), "decay_rate": -0.5}),
    ("Muon-defaults", "Muon", {}),
    ("Muon-no-nesterov", "Muon", {"lr": 0.01, "weight_decay": 0.0, "momentum": 0.9, "nesterov": False, "ns_steps": 3}),
]

# (case id, class name in optim.lr_scheduler, kwargs); "children" build SequentialLR / ChainedLR.
SCHEDULER_CASES: list[tuple[str, str, dict]] = [
    ("ConstantLR", "ConstantLR", {"learning_rate": 0.1}),
    ("PolynomialLR", "PolynomialLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01,
                                      "total_iters": 300, "power": 2.0}),
    ("PolynomialLR-cycle", "PolynomialLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01,
                                            "total_iters": 300, "power": 2.0, "cycle": True}),
    ("LinearLR", "LinearLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01, "total_iters": 300}),
    ("LinearLR-cycle", "LinearLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01, "total_iters": 300,
                                    "cycle": True}),
    ("LinearLR-warmup", "LinearLR", {"initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 100}),
    ("ExponentialLR", "ExponentialLR", {"initial_learning_rate": 0.1, "total_iters": 100, "decay_rate": 0.5}),
    ("ExponentialLR-staircase", "ExponentialLR", {"initial_learning_rate": 0.1, "total_iters": 100,
                                                  "decay_rate": 0.5, "staircase": True}),
    ("InverseExponentialTimeDecayLR", "InverseExponentialTimeDecayLR",
     {"initial_learning_rate": 0.1, "step_exponent": 1, "total_iters": 100, "decay_rate": 0.5}),
    ("InverseExponentialTimeDecayLR-staircase", "InverseExponentialTimeDecayLR",
     {"initial_learning_rate": 0.1, "step_exponent": 2, "total_iters": 1000, "decay_rate": 0.5, "staircase": True}),
    ("InverseSquareRootDecayLR", "InverseSquareRootDecayLR", {"initial_learning_rate": 0.1, "scale": 2.0,
                                                              "warmup_steps": 50}),
    ("CosineDecayLR", "CosineDecayLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01, "total_iters": 300}),
    ("PiecewiseConstantLR", "PiecewiseConstantLR", {"learning_rates": [0.1, 0.05, 0.01], "milestones": [200, 500]}),
    ("MultiStepLR", "MultiStepLR", {"initial_learning_rate": 0.1, "gamma": 0.5, "milestones": [100, 300, 600]}),
    ("StepLR", "StepLR", {"initial_learning_rate": 0.1, "step_size": 150, "gamma": 0.5}),
    ("CosineAnnealingLR", "CosineAnnealingLR", {"initial_learning_rate": 0.1, "T_max": 200, "eta_min": 0.01}),
    ("LambdaLR-default", "LambdaLR", {"initial_learning_rate": 0.1}),
    ("CosineAnnealingWarmRestarts", "CosineAnnealingWarmRestarts", {"initial_learning_rate": 0.1, "T_0": 100,
                                                                    "eta_min": 0.01}),
    ("MultiplicativeLR", "MultiplicativeLR", {"initial_learning_rate": 0.1, "coefficient": 0.995}),
    ("CyclicLR-triangular", "CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 100}),
    ("CyclicLR-triangular2", "CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 100,
                                          "step_size_down": 50, "mode": "triangular2"}),
    ("CyclicLR-exp_range", "CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 100, "mode": "exp_range",
                                        "gamma": 0.998}),
    ("OneCycleLR", "OneCycleLR", {"initial_learning_rate": 0.004, "max_lr": 0.1, "total_steps": 1000}),
    ("OneCycleLR-linear", "OneCycleLR", {"initial_learning_rate": 0.004, "max_lr": 0.1, "total_steps": 800,
                                         "anneal_strategy": "linear"}),
    ("OneCycleLR-three-phase", "OneCycleLR", {"initial_learning_rate": 0.004, "max_lr": 0.1, "total_steps": 800,
                                              "three_phase": True, "anneal_strategy": "linear"}),
    ("SequentialLR-warmup-cosine", "SequentialLR", {"milestones": [100], "children": [
        ("LinearLR", {"initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 100}),
        ("CosineDecayLR", {"initial_learning_rate": 0.1, "end_learning_rate": 0.01, "total_iters": 400})]}),
    ("ChainedLR-step-exponential", "ChainedLR", {"children": [
        ("StepLR", {"initial_learning_rate": 0.1, "step_size": 150, "gamma": 0.5}),
        ("ExponentialLR", {"initial_learning_rate": 0.2, "total_iters": 100, "decay_rate": 0.9})]}),
]

# weight-decay schedules (optim.weight_decay_scheduler), on an AdamW with weight_decay=0.1
WD_SCHEDULER_CASES: list[tuple[str, str, dict]] = [
    ("CosineDecayWD", "CosineDecayWD", {"initial_val": 0.1, "end_val": 0.0, "total_iters": 300}),
    ("LinearWD", "LinearWD", {"initial_val": 0.0, "end_val": 0.1, "total_iters": 200}),
    ("ExponentialWD", "ExponentialWD", {"initial_val": 0.1, "total_iters": 100, "decay_rate": 0.5}),
]

# metric cases: (case id, class name, kwargs); inputs are generated from a fixed numpy seed
METRIC_CASES: list[tuple[str, str, dict]] = [
    ("AUC-ROC", "AUCMetric", {"name": "auc"}),
    ("AUC-ROC-20", "AUCMetric", {"name": "auc", "num_thresholds": 20}),
    ("AUC-PR", "AUCMetric", {"name": "auc", "curve": "PR"}),
    ("AUC-PR-20", "AUCMetric", {"name": "auc", "curve": "PR", "num_thresholds": 20}),
    ("AUC-PR-minoring", "AUCMetric", {"name": "auc", "curve": "PR", "summation_method": "minoring"}),
    ("AUC-PR-majoring", "AUCMetric", {"name": "auc", "curve": "PR", "summation_method": "majoring"}),
    ("AUC-ROC-thresholds", "AUCMetric", {"name": "auc", "thresholds": [0.1, 0.3, 0.5, 0.7, 0.9]}),
]


def build_scheduler(module, opt, cls_name: str, kwargs: dict):
    """Build one scheduler case from ``module`` (the vendor's or cs-run's), composites from their children."""
    kwargs = dict(kwargs)
    children = kwargs.pop("children", None)
    cls = getattr(module, cls_name)
    if children is None:
        return cls(opt, **kwargs)
    built = [getattr(module, name)(opt, **kw) for name, kw in children]
    if cls_name.startswith("Chained"):
        return cls(built, **kwargs)
    return cls(opt, built, **kwargs)
