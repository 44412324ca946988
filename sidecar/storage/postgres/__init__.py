"""The team store: PostgreSQL through psycopg 3, imported only for a postgresql:// URL."""
