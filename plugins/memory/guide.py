"""The workflow, returned by `context_guide`, so that every tool description can stay one sentence."""

GUIDE = """\
How to work with a small context window through this gateway

The gateway cannot see or trim your conversation. It only sees the tool calls that pass through it, so \
keeping the window small depends on you calling these tools.

1. Memory. At the start, context_open(session_id) with a short name for the task. Save the goal and hard \
constraints with context_append(..., pinned=true). Save facts, decisions and results as you go with \
context_append: anything you will need after it scrolls out of the window. Check context_status now and \
then; when it warns, context_compact folds older notes into a summary (lines with identifiers, paths and \
numbers are kept whole; nothing is deleted). Before relying on something from earlier, \
context_recall(session_id, query) brings back the pinned notes and the best matches, folded originals \
included: query an identifier as written (src/app.ts:42) to get its line back verbatim.

2. Big tool results. A result too large for the window comes back as a fileRef (id resp_...). Do not read \
the file whole. Call response_outline(path=id) first; then response_slice for one value (json_path like \
data.0.name) or a line range, response_search for records or lines with given words, response_compress for \
a smaller view (sample_array, select_keys, keys_only, ...). Follow next_path to page. To count, sum or group the whole result, ask response_query(path=id, sql=...): DuckDB SQL over the tables the fileRef names: items (the largest array of records, object keyed by name with its key column, CSV with typed columns and NA as NULL, or JSON Lines; nested fields as customer.city, lists with list_contains or unnest), other parts by path, doc (the whole JSON) of a JSON result, lines(n, text) of a text one, numbered as grep -n; response_outline profiles the columns and gives example queries. Only answers come back, cut to a budget.

3. Big documents. doc_ingest(file_path or text) splits a document by its headings; doc_search(query) finds \
the relevant chunks; doc_window(doc_id, start, end) reads consecutive chunks. Offloaded text results can be \
searched the same way by their resp_ id.

4. Many tools. If only tool_search, tool_schema and tool_call are listed (catalog mode), search for a tool \
by what it does, read its schema, then call it with tool_call.

5. When the gateway adds a note that the context is running low, save what matters with context_append and \
consider context_compact; it is advice, not an order.
"""
