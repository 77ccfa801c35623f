#!/usr/bin/env bash
echo draft > /app/draft.txt
