from rankops.cli import main

main()
