from wakustore.cli.main import main

raise SystemExit(main())
