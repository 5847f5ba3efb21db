"""The benchmarks (``wakustore bench ...``) and the model-based crash soak
(``wakustore soak``); the ``bench`` extra of the package. The PostgreSQL
comparison may install a server (bench/sql.py): nothing outside this
package installs system packages."""
