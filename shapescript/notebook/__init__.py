"""ShapeScript in Jupyter and IPython: `%load_ext shapescript`, then `%%shapescript` cells.

magic.py holds the magics (the only module that imports IPython), session.py the notebook's
program and its workers, cells.py how cells add up to one program, report.py how a compile error
shows, workers.py the workers that outlive the cells, and handlers.py what the workers answer for
`%shapescript status`. This package's own import pulls in nothing: workers import handlers.py.
"""
