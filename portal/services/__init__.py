"""The portal's logic behind its pages, API and sockets: work.py (instances and jobs), arrays.py (+ array_spec.py,
pure), images.py (saved images), files.py and logs.py (through a host's relay: relay.py), tokens.py (API tokens),
slow.py (per-user slow operations), housekeeping.py (idle auto-stop, release), recommend.py (pure), demo.py."""
