"""Fusion rules: one module per rule (or family), each registering itself with @rule."""

import importlib
import pkgutil

# Importing every module of the package registers its rules; a new rule is one new file.
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
