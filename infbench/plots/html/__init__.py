"""The HTML report (`infbench report --html`, `infbench compare --html`): `page` assembles
one self-contained file from `tables` (plain HTML) and `figures` (plotly, drawn from the
same data as the matplotlib figures of `infbench plots`)."""
