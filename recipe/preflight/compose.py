"""Phase 2: compose the overrides as the launch does, then what verl checks only inside its workers."""
from __future__ import annotations

import contextlib
import io

from ..settings import RecipeConfigError
from .knobs import ARR, MEG, config_name
from .report import PreflightReport


def compose_config(report: PreflightReport):
    """Compose exactly what ``python -m recipe.main --config-name <name> <overrides>`` composes, then
    ``prepare_config``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..main import CONFIGS_DIR, prepare_config

    try:
        with initialize_config_dir(config_dir=CONFIGS_DIR, version_base=None):
            cfg = compose(config_name=config_name(report.values), overrides=report.overrides)
    except (HydraException, OmegaConfBaseException) as e:
        detail = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        report.errors.append(f"the overrides do not compose: {detail} (check the extra arguments passed after the "
                             "script name; a key that already exists is set without '+')")
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()), quiet():
            prepare_config(cfg)  # resolves first, so the checks below see plain values even if it fails later
    except RecipeConfigError as e:
        report.errors.append(str(e))
    except OmegaConfBaseException as e:
        report.errors.append(f"the config does not resolve: {e}")
        return None
    except (AssertionError, ValueError, TypeError, KeyError, HydraException) as e:
        report.errors.append(f"verl rejected the config (validate_config): {type(e).__name__}: {e}")
    report.config = cfg
    return cfg


@contextlib.contextmanager
def quiet():
    """verl warns about the missing accelerator and TP=1; those are expected on the CPU and not user errors."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def check_verl_dataclasses(cfg, megatron: bool, errors: list[str]) -> None:
    """What verl checks only when the workers build their configs (e.g. the rollout EP rule)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    for key in (f"{ARR}.rollout", MEG) if megatron else (f"{ARR}.rollout",):
        try:
            with quiet():
                omega_conf_to_dataclass(OmegaConf.select(cfg, key))
        except Exception as e:  # noqa: BLE001 - report whatever verl raises, without a traceback
            errors.append(f"verl rejects {key}: {type(e).__name__}: {e}")

