"""The text forms of ``timeline synth --change`` and ``--drift`` (``synth_changes``
parses them): their own module so that the command's parser, built for every command,
imports no numpy to show them."""

CHANGE_FORM = ("STEP:RANK:STAGE:TASK:PHASE:±AMOUNT[@LAYER], the target as --inject's (RANK a rank or *, TASK a "
               "task, * or ctaN, PHASE hint staged compute end), AMOUNT ns or a % of the kernel time, + slower "
               "or - faster from STEP on, @LAYER one layer only, e.g. 40:1:o:*:compute:+2% or 25:*:ug:cta3:end:-1500@2")
DRIFT_FORM = ("STEP:RANK:STAGE:TASK:PHASE:+AMOUNT[@LAYER]: the amount reached linearly from 0 at STEP to the last "
              "step, e.g. 0:*:down:*:compute:+3%")

__all__ = ["CHANGE_FORM", "DRIFT_FORM"]
