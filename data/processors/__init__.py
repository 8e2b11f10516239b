"""The data processors, one module per family of Model Zoo processor classes; importing this package
imports each module, which registers its functions (:func:`cs_run.registry.register_data_processor`).
The registry imports it on the first lookup of a processor, so a new module here needs no other edit."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
