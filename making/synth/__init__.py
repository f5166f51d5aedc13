"""Synthetic tasks: bugs injected into a repository by small AST mutations (SWE-smith style).

:mod:`.mutations` makes the bugs (pure, one function at a time), :mod:`.statement` writes the bug
reports from the failing tests, :mod:`.generate` runs the pipeline behind ``patchgym tasks synth``.
"""

from patchgym.making.synth.generate import Listener, SynthError, SynthOptions, SynthReport, synthesize
from patchgym.making.synth.mutations import KINDS, Mutant, chosen_kinds, mutants

__all__ = ["KINDS", "Listener", "Mutant", "SynthError", "SynthOptions", "SynthReport", "chosen_kinds", "mutants",
           "synthesize"]
