"""Distortion: what a lossy acceptance rule does to the distribution it samples from, per position.

    forms.py   pi = q . a + (1 - sum q a) r: each rule's one-position output distribution, in closed
               form (exact, sampling, lenience, ensemble, typical, kl-judge), as a bound (FLy) or
               by Monte Carlo over dropout masks (DropMatch); a registry a user's rule can join
    meter.py   TV(pi, p) and KL(p || pi) per judged position; DistortionMeter(policy) records them
               during a real run without changing a token

    meter = DistortionMeter(acceptance.get("typical"))
    generate(target, prompt, draft=draft, policy=meter, temperature=1.0)
    meter.summary()   # {"tv_mean": ..., "tv_p95": ..., "kl_mean": ..., ...}
"""

from minispec.lab.distortion.forms import Form, FormContext, NotCovered, form_of, register_form
from minispec.lab.distortion.meter import (DistortionMeter, PositionDistortion, kl_from_target,
                                                  output_distribution, position_distortion, summarise,
                                                  total_variation)

__all__ = ["Form", "FormContext", "NotCovered", "form_of", "register_form", "DistortionMeter", "PositionDistortion",
           "kl_from_target", "output_distribution", "position_distortion", "summarise", "total_variation"]
