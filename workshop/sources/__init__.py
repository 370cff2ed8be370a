"""The five documents the workshop was planned from, and what each one says, as data.

A lesson that uses a document's fact or figure names the document beside it
(``documents.cite``). The documents themselves are not part of the project (their
sentences may not be copied); what is kept here is their bibliographic data, their
tables (``tables``, ``storage``) and, for checking, the set of numbers each one contains
(``numbers.json``, made from the documents by ``python -m workshop.sources index
FOLDER``): a figure the workshop credits to a document must be among that document's
numbers (``documents.holds``).

Imports: the base modules only (it is data and its checks), so every wing above may
read it.

Offered here: document_table and document_tables (a document's benchmark tables as
data), storage_table (a site's file systems, from document 004).
"""

from .._exports import offer

_NAMES = {
    "document_table": "tables",
    "document_tables": "tables",
    "storage_table": "storage",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = offer(__name__, _NAMES)
