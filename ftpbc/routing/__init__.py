"""Rule-based routing, the pure half: rulesets that select messages by their properties and
bodies (:mod:`ftpbc.routing.rules`), and destination URIs built from templates
(:mod:`ftpbc.routing.templates`).  No I/O here: the serving loop and the delivery workers live
in :mod:`ftpbc.node.router` and :mod:`ftpbc.node.destinations`, the journaled delivery in
:mod:`ftpbc.exchange.route` (docs/routing.md)."""
