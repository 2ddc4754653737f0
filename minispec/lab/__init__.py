"""The lab: what the docs measured about the method, kept beside the reference and never inside it.

    distortion/            how far a lossy rule's output is from the target's distribution, per position
                           (forms.py: each rule's one-position output in closed form; meter.py: a meter
                           that wraps a policy during a real run)
    draft_length.py        schedules that study when speculation pays: Fallback (plain decoding once a
                           request's speculation stops paying) and Priced (the CLI's --draft-length auto)
    step_cost.py           what a step of g drafts costs on this CPU, in plain steps: Priced's prices
    dropout_calibration.py DropMatch's dropout rate p from a target agreement level (the CLI's p=auto)
    pacing.py              a stream in fixed chunks at a fixed cadence: the accepted counts hidden

The rule (tests/test_house.py): nothing in the reference (model/, acceptance/, the chapters, the
wings) imports the lab; the lab imports them, and the command line and the scripts use it.
"""
