"""Position methods. Imports only torch."""

from .taper import TAPER_MODES, TAPER_SCHEDULES, extend_position_table, taper_amplitudes

__all__ = ["TAPER_MODES", "TAPER_SCHEDULES", "extend_position_table", "taper_amplitudes"]
