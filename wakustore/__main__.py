from wakustore.cli import main

raise SystemExit(main())
