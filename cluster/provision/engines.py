"""The engine a master.conf asks for: ``provision_engine = slurm | gridengine | module:Class``.

docs/provisioning.md, "The engine interface".  ``slurm`` is
:class:`cluster.provision.slurm.SlurmEngine` with the ``slurm_*`` settings, ``gridengine``
is :class:`cluster.provision.gridengine.GridEngine` with the ``gridengine_*`` settings, and
``module:Class`` is a site's own class: imported from ``module`` (on the provisioner's
``PYTHONPATH``) and made with ``Class.from_config(cfg)`` when it has that class method,
else ``Class(cfg)``.  Whatever it makes must have the interface of
:class:`cluster.provision.engine.Engine` (``label``, ``job_id_shell``, ``submit``,
``cancel``, ``jobs``); a name that is none of these, a module that does not import or a
class that lacks the interface is a :class:`cluster.errors.ConfigError` naming the setting.
"""

from __future__ import annotations

import importlib
from typing import cast

from cluster.config import Config
from cluster.errors import ConfigError
from cluster.provision.engine import Engine

#: The engines built in, by their setting's value.
BUILT_IN = ("slurm", "gridengine")
#: What an engine must have.
INTERFACE = ("label", "job_id_shell", "submit", "cancel", "jobs")


def make_engine(cfg: Config) -> Engine:
    """The engine ``cfg.provision_engine`` names (module docstring)."""
    name = cfg.provision_engine.strip()
    if name == "slurm":
        from cluster.provision.slurm import SlurmEngine  # each engine only where used

        return SlurmEngine.from_config(cfg)
    if name == "gridengine":
        from cluster.provision.gridengine import GridEngine

        return GridEngine.from_config(cfg)
    module_name, colon, class_name = name.partition(":")
    expected = "slurm, gridengine, or module:Class (a class of the site's)"
    if not colon or not module_name or not class_name.isidentifier():
        raise ConfigError("provision_engine", name, expected)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("provision_engine", name,
                          f"{expected}; module {module_name} cannot be imported: {exc}"
                          ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise ConfigError("provision_engine", name,
                          f"{expected}; {module_name} has no class {class_name}")
    made = cls.from_config(cfg) if hasattr(cls, "from_config") else cls(cfg)
    missing = [attr for attr in INTERFACE if not hasattr(made, attr)]
    if missing:
        raise ConfigError("provision_engine", name,
                          f"an engine with {', '.join(INTERFACE)}; it lacks "
                          f"{', '.join(missing)}")
    return cast(Engine, made)
