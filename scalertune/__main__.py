from scalertune.cli import program

program()
