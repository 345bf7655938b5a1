"""The performance model: what a device can do (`device`) and what an op costs (`traffic`,
`savings`): bytes moved, and what a fusion that stops moving them saves. The roofline
(`roofline`) puts each op's FLOPs and bytes (`cost`, `flop_table`) against a part's peaks
(`specs`; achievable ones measured by `calibrate`).

Between relations and rules: it reads frames and data-flow ops, and rules and reports use
it for every saving they state.
"""
