#!/bin/bash
set -eu
# The agent acts as the user the Dockerfile created, in the Dockerfile's WORKDIR.
echo "$(id -un) $(pwd)" > whoami.txt
python3 -c "import urllib.request as u; open('answer.txt', 'wb').write(u.urlopen('http://127.0.0.1:8000/index.html').read())"
