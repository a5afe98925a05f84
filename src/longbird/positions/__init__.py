"""Position methods: TAPER (extended absolute tables), BiALiBi (LittleBird's relative bias) and TAPE (position states
updated in every layer). Imports only torch and the standard library (`lint-imports` checks it). Shapes use the
notation of `longbird.attention`: B batch, H heads, l length, d head size, b block size, n blocks, s pack size;
w the embedding width (TAPER's tables).
"""

from .taper import TAPER_MODES, TAPER_SCHEDULES, extend_position_table, taper_amplitudes

__all__ = ["TAPER_MODES", "TAPER_SCHEDULES", "extend_position_table", "taper_amplitudes"]
