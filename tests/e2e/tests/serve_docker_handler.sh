# One HTTP/1.1 exchange on stdin and stdout (busybox nc -ll -e runs it per connection): 200 to
# any GET (the readiness probe), and to a POST an Open Inference Protocol answer y = factor * x,
# the factor read from the model version's factor.txt.
read -r method path version
length=0
while IFS= read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in
    [Cc]ontent-[Ll]ength:*) length=$(echo "${line#*:}" | tr -d ' ') ;;
  esac
done
body='{}'
if [ "$method" = POST ]; then
  data=$(head -c "$length" | sed 's/.*"data":\[\([^]]*\)\].*/\1/')
  factor=$(cat "$KILN_MODEL_DIR/factor.txt")
  y=$(awk -v f="$factor" -v d="$data" 'BEGIN { n = split(d, a, ","); for (i = 1; i <= n; i++) printf "%s%s", (i > 1 ? "," : ""), a[i] * f; printf ";%d", n }')
  body="{\"model_name\":\"scale\",\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP64\",\"shape\":[${y#*;}],\"data\":[${y%;*}]}]}"
fi
printf 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "${#body}" "$body"
