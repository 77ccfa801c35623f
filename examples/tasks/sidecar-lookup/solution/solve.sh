#!/usr/bin/env bash
python3 -c "import urllib.request; print(urllib.request.urlopen('http://api:8080/secret').read().decode().strip())" > /app/answer.txt
