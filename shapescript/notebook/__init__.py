"""ShapeScript in Jupyter and IPython: `%load_ext shapescript`, then `%%shapescript` cells.

magic.py holds the magics (the only module that imports IPython), session.py the notebook's
program and its workers, cells.py how cells add up to one program, report.py how a compile error
shows, workers.py the workers that outlive the cells, and handlers.py what the workers answer for
`%shapescript status`. This package's own import pulls in nothing: workers import handlers.py.

What the notebook draws: device_table.py (the DeviceTable as HTML and text), models.py (a model's
table and a param's values), widgets.py (the ipywidgets made of them; the only module that imports
ipywidgets), progress.py (a progress bar for loops over batches) and live.py (`ss.sinks.live()`,
charts of what a program logs); markup.py holds the HTML they share. Outside magic.py, IPython is
only used where a kernel has already imported it.
"""
