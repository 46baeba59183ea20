"""A live dispute explorer in the browser: jobs, slots, deadlines, and every dispute level by level.

``chain_view`` reads the chain (the one module here that touches the typed clients), ``follower``
keeps its latest snapshot on a background thread, ``server`` serves JSON, server-sent events and
the page in ``static/``; ``instruction`` decodes the one instruction a dispute ends on.
See docs/explorer.md.
"""
