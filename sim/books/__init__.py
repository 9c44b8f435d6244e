"""The books of a run: fault books that balance (:mod:`~sim.books.accounting`), each
request's outcome and the bytes per edge (:mod:`~sim.books.tally`) and the report that
holds and renders them (:mod:`~sim.books.report`).

Above :mod:`sim.run` and :mod:`sim.net`; beside :mod:`sim.cache`, never importing it."""
