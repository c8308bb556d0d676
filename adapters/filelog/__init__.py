"""File-log adapter: the reference adapter of the *log* shape (cursors over append-only
logs in a local directory), for development and tests; see ``adapter``'s docstring."""
