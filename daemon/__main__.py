from pilot.daemon.main import main

main()
